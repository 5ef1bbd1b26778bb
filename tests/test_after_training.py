"""After training, on a tiny SFT run through the embedded Loops: export the adapter and a merged model (their
logits match base+adapter), refuse bad exports atomically, and chat with checkpoints through `project.sampler`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from test_sft_train import PAIRS, chat, write_project
from tiny_models import build_tiny_chat_model
from widgets.lab_sanitizer import stripped

import loops_nb.export as export_module
from loops_nb import load
from loops_nb.cli import main
from loops_nb.errors import UserError
from loops_nb.export import export_run
from loops_nb.widgets.side_by_side import side_by_side

pytestmark = (
    pytest.mark.slow
)  # trains a tiny run through the embedded Loops, then loads models (about a minute)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("after-training")
    model = build_tiny_chat_model(folder / "model")
    rows = [chat(*PAIRS[i % len(PAIRS)]) for i in range(24)]
    config = write_project(folder, model, train=rows, max_steps=4, save_every=2, eval_every=0)
    project = load(config)
    outcome = project.train_sync(observers=[])
    return project, Path(outcome.run_dir), model


def _logits(model, ids):
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def _base_and_adapter(model_dir: Path, adapter_dir: Path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype="float32")
    ids = list(range(5, 40))
    base_logits = _logits(base, ids)
    with_adapter = PeftModel.from_pretrained(base, str(adapter_dir))
    return ids, base_logits, _logits(with_adapter, ids)


def test_the_adapter_export_loads_with_peft_and_names_the_base_model(trained, tmp_path):
    _project, run, model = trained
    out = tmp_path / "adapter"
    result = asyncio.run(export_run(run, out))
    assert result.checkpoint.kind == "sampler" and result.checkpoint.step == 4
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(model) and config["r"] == 8
    assert (out / "tokenizer_config.json").is_file()
    record = json.loads((out / "loops_export.json").read_text())
    assert record["checkpoint"].endswith("sampler_weights/final-000004") and record["merged"] is False
    _ids, base_logits, adapter_logits = _base_and_adapter(model, out)
    assert (adapter_logits - base_logits).abs().max() > 1e-3, "the exported adapter changes nothing"


def test_the_merged_export_loads_with_from_pretrained_and_matches_base_plus_adapter(trained, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, run, model = trained
    adapter, merged_dir = tmp_path / "adapter", tmp_path / "merged"
    assert main(["export", str(run), "--to", str(merged_dir), "--merged", "--checkpoint", "2"]) == 0
    assert main(["export", str(run), "--to", str(adapter), "--checkpoint", "state-000002"]) == 0
    assert (merged_dir / "model.safetensors").is_file() and not (merged_dir / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(str(merged_dir), dtype="float32")
    ids, base_logits, adapter_logits = _base_and_adapter(model, adapter)
    merged_logits = _logits(merged, ids)
    assert (merged_logits - adapter_logits).abs().max() < 1e-4
    assert (merged_logits - base_logits).abs().max() > 1e-3, "the merge changed nothing"
    tokenizer = AutoTokenizer.from_pretrained(str(merged_dir))
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert "<|im_start|>user" in text, "the chat template travels with the merged model"


def test_bad_exports_are_one_line_errors_and_leave_nothing_behind(trained, tmp_path, monkeypatch, capsys):
    _, run, _ = trained
    (tmp_path / "taken").mkdir()
    for args, needle in [
        ([str(tmp_path / "no-run"), "--to", str(tmp_path / "x")], "no such run directory"),
        ([str(run), "--to", str(tmp_path / "taken")], "already exists"),
        ([str(run), "--to", str(tmp_path / "x"), "--checkpoint", "9"], "no checkpoint '9'"),
    ]:
        assert main(["export", *args]) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(export_module, "_write_tokenizer", broken)
    with pytest.raises(OSError, match="disk full"):
        asyncio.run(export_run(run, tmp_path / "half"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"], "no half-written target or temp dir"


async def test_the_sampler_chats_with_checkpoints_and_the_base_side_by_side(trained):
    project, run, _ = trained
    policy = project.sampler()
    assert policy.run.root == run and policy.label == "final-000004"
    try:
        prompt = [{"role": "user", "content": PAIRS[0][0]}]
        reply = await policy.chat(prompt, max_tokens=6)
        assert reply.completion_tokens == len(reply.tokens) == len(reply.logprobs) == 6
        assert reply.prompt_tokens > 0 and all(lp is not None and lp <= 0 for lp in reply.logprobs)
        # The sync variant works while this test's event loop is running (as in a notebook cell).
        again = policy.chat_sync(prompt, max_tokens=6)
        assert again.tokens == reply.tokens, "greedy sampling repeats itself"
        base, middle = policy.base(), policy.at(2)
        view = await side_by_side([PAIRS[0][0], PAIRS[1][0]], base, middle, policy, max_tokens=6)
        assert view.labels == ["base", "state-000002", "final-000004"]
        base_reply, _, final_reply = view.replies[0]
        assert base_reply.logprobs != final_reply.logprobs, "the adapter is served, not the base again"
        html = view.to_html()
        assert "logprob" in html and 'title="token 1:' in html
        assert stripped(html) == [], "JupyterLab's sanitizer would strip part of the saved view"
        assert "SideBySide(2 prompts; base: 12 tokens" in str(view)
    finally:
        await policy.aclose()
    with pytest.raises(UserError, match="closed"):
        policy.chat_sync("hello")
