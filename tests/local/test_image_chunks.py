"""Images end to end on the embedded Loops, with the tiny random VLM (`loops-nb/tiny-random-vlm`).

Random weights cannot learn anything; these tests prove the plumbing: image parts render through the
model's processor into the SDK's image chunks, the sampler and the trainer see the same images at the same
positions (their logprobs agree), the capture carries the images into training datums, and the counting
example checks and trains.
"""

from __future__ import annotations

import asyncio
import base64
import io
from pathlib import Path

import pytest
import torch
from baseten.loops import AdamParams, ImageChunk, ModelInput, SamplingParams
from helpers import import_file, read_jsonl, run_cli

from loops_nb.llm.model_input import model_input
from loops_nb.llm.vision import VisionRenderer, load_processor
from loops_nb.local.tiny_vlm import TINY_VLM

REPO = Path(__file__).resolve().parents[2]
COUNTING = REPO / "examples" / "counting"
LOGPROB_TOLERANCE = 2e-4


@pytest.fixture(scope="module")
def vlm_path(model_cache_dir: Path) -> Path:
    from loops_nb.local.model_store import resolve_model

    return resolve_model(TINY_VLM, cache_dir=model_cache_dir).path


@pytest.fixture(scope="module")
def renderer(vlm_path: Path) -> VisionRenderer:
    processor = load_processor(str(vlm_path))
    assert processor is not None
    return VisionRenderer(processor)


@pytest.fixture(scope="module")
def circles():
    # By path, under its own name: other tests import other examples' `episode` modules.
    return import_file(COUNTING / "episode.py", "counting_episode").draw_circles(3, seed=1)


def _messages(part):
    return [{"role": "user", "content": [part, {"type": "text", "text": "How many circles?"}]}]


def test_every_image_source_renders_to_the_same_chunks(renderer, circles, tmp_path):
    buffer = io.BytesIO()
    circles.save(buffer, format="PNG")
    png = buffer.getvalue()
    (tmp_path / "c.png").write_bytes(png)
    data_url = "data:image/png;base64," + base64.b64encode(png).decode()
    parts = [
        {"type": "image", "image": circles},
        {"type": "image", "image": str(tmp_path / "c.png")},
        {"type": "image", "path": tmp_path / "c.png"},
        {"type": "image", "image": png},
        {"type": "image_url", "image_url": {"url": data_url}},
    ]
    rendered = [renderer.render_prompt(_messages(p)) for p in parts]
    ids, images = rendered[0]
    assert all(r == rendered[0] for r in rendered[1:])
    (image,) = images
    assert image.length == 16  # 224x224 -> 112x112 at most -> 8x8 patches / 2x2 merge
    assert ids[image.offset : image.offset + image.length] == [renderer.image_token_id] * 16
    chunks = model_input(ids, images).chunks
    assert [type(c).__name__ for c in chunks] == ["EncodedTextChunk", "ImageChunk", "EncodedTextChunk"]
    assert chunks[1].expected_tokens == 16 and chunks[1].format == "png"
    assert renderer.decode(chunks[0].tokens).endswith("<|vision_start|>")
    assert renderer.decode(chunks[2].tokens).startswith("<|vision_end|>How many circles?")
    # Text-only messages are unchanged.
    assert renderer.render_prompt([{"role": "user", "content": "hi"}])[1] == ()


@pytest.fixture(scope="module")
def svc(embedded_loops):
    return embedded_loops.service_client()


def test_sampler_and_trainer_see_the_same_images(svc, embedded_loops, renderer, circles):
    ids, images = renderer.render_prompt(_messages({"type": "image", "image": circles}))
    prompt = model_input(ids, images)
    tc = svc.create_lora_training_client(base_model=TINY_VLM, rank=4, seed=0)
    sc = tc.save_weights_and_get_sampling_client("v0")
    resp = sc.sample(prompt, num_samples=3, sampling_params=SamplingParams(max_tokens=6, seed=2))
    assert len(resp.sequences) == 3
    assert resp.prompt_token_ids == ids  # the sampler echoes the expanded prompt
    from loops_nb.rl.datums import SequenceDatum

    datums = []
    for seq in resp.sequences:
        n = len(ids)
        datums.append(
            SequenceDatum(
                ids + list(seq.tokens),
                [False] * n + [True] * len(seq.tokens),
                [0.0] * n + seq.logprobs,
                1.0,
                "a",
                images,
            )
        )
    wire = [d.to_datum() for d in datums]
    assert isinstance(wire[0].model_input.chunks[1], ImageChunk)
    fb = tc.forward_backward(wire, loss_fn="importance_sampling").result()
    for seq, out in zip(resp.sequences, fb.loss_fn_outputs, strict=True):
        trained = out["logprobs"].data[-len(seq.tokens) :]
        assert max(abs(a - b) for a, b in zip(trained, seq.logprobs, strict=True)) < LOGPROB_TOLERANCE
    # Prompt logprobs of an image prompt come back aligned with the expanded ids.
    scored = sc.compute_logprobs(prompt)
    assert len(scored) == len(ids) and scored[0] is None and scored[-1] is not None
    before = embedded_loops.state.run(tc.run_id).trainer.adapter_state_dict()
    step = tc.optim_step(AdamParams(learning_rate=1e-2)).result()
    assert step.metrics["grad_norm"] > 0
    after = embedded_loops.state.run(tc.run_id).trainer.adapter_state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # Without the image the same text gives other logprobs: the image really reaches the model.
    text_only = SequenceDatum(
        [t if t != renderer.image_token_id else 0 for t in datums[0].tokens],
        datums[0].sampled,
        datums[0].logprobs,
        1.0,
        "b",
    )
    plain = tc.forward([text_only.to_datum()], loss_fn="importance_sampling").result()
    assert plain.loss_fn_outputs[0]["logprobs"].data[-1] != pytest.approx(
        fb.loss_fn_outputs[0]["logprobs"].data[-1]
    )
    tc.close()


def test_a_wrong_image_token_count_is_refused(svc, renderer, circles):
    ids, images = renderer.render_prompt(_messages({"type": "image", "image": circles}))
    chunks = [c.model_dump(mode="json") for c in model_input(ids, images).chunks]
    chunks[1]["expected_tokens"] = 15
    tc = svc.create_lora_training_client(base_model=TINY_VLM, rank=4, seed=0)
    sc = tc.save_weights_and_get_sampling_client("v0")
    bad = ModelInput.model_validate({"chunks": chunks})
    with pytest.raises(Exception, match="expected_tokens"):
        sc.sample(bad, num_samples=1, sampling_params=SamplingParams(max_tokens=2))
    tc.close()


def test_a_text_model_refuses_image_chunks(embedded_loops, tiny_chat_model, renderer, circles):
    ids, images = renderer.render_prompt(_messages({"type": "image", "image": circles}))
    chunks = [c.model_dump(mode="json") for c in model_input(ids, images).chunks]
    chunks[0]["tokens"] = [1, 2]
    chunks[2]["tokens"] = [3]
    svc = embedded_loops.service_client()
    tc = svc.create_lora_training_client(base_model=str(tiny_chat_model), rank=4, seed=0)
    sc = tc.save_weights_and_get_sampling_client("v0")
    with pytest.raises(Exception, match="text-only"):
        sc.sample(ModelInput.model_validate({"chunks": chunks}), num_samples=1)
    tc.close()


def test_the_model_client_captures_images_into_training_datums(svc, renderer, circles):
    from loops_nb.llm.client import LoopsLLM, SamplingDefaults
    from loops_nb.rl.datums import sequence_datums
    from loops_nb.rl.policy import Policy

    tc = svc.create_lora_training_client(base_model=TINY_VLM, rank=4, seed=0)
    policy = Policy(tc, TINY_VLM)
    asyncio.run(policy.publish())
    handle = LoopsLLM(renderer, policy, defaults=SamplingDefaults(max_tokens=4), seed=5)
    reply = asyncio.run(handle.chat(_messages({"type": "image", "image": circles})))
    assert reply.tokens > 0
    (call,) = handle.capture.calls
    (image,) = call.images
    (seq,) = handle.capture.sequences()
    assert seq.images == [image]
    (datum,) = sequence_datums([seq], advantage=1.0, attempt_id="a")
    chunks = datum.to_datum().model_input.chunks
    assert [type(c).__name__ for c in chunks] == ["EncodedTextChunk", "ImageChunk", "EncodedTextChunk"]
    assert chunks[1].expected_tokens == image.length
    tc.close()


@pytest.mark.slow
def test_the_counting_example_checks_its_images_and_trains(tmp_path: Path, model_cache_dir: Path) -> None:
    env = {"LOOPS_NB_CACHE": str(model_cache_dir), "HF_HUB_OFFLINE": "1"}
    config = COUNTING / "train_local.toml"
    common = ["--output.output_dir", str(tmp_path)]
    check = run_cli("check", config, *common, env=env, timeout=600, cwd=tmp_path)
    assert check.returncode == 0, check.stderr[-3000:]
    assert "16 image(s) costing 256 image tokens" in check.stdout
    assert "prompt circles-000: " in check.stdout and "224x224 px -> 16 tokens" in check.stdout
    run = run_cli("run", config, *common, "--output.run_name", "count", env=env, timeout=900, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    steps = read_jsonl(tmp_path / "count" / "steps.jsonl")
    assert len(steps) == 2
    assert sum(s["tokens/trained"] for s in steps) > 0  # a training step ran on image prompts
    assert all(abs(s["kl/sample_train_v1"]) < 1e-3 for s in steps if s["tokens/trained"])
    # The held-out evaluation ([eval] options: another seed) before and after training, on images training never saw.
    assert "eval: 8 task(s) (held-out runtime options; 16 train)" in check.stdout
    assert [e["step"] for e in read_jsonl(tmp_path / "count" / "evals.jsonl")] == [0, 2]
    evaluated = {r["task"] for r in read_jsonl(tmp_path / "count" / "eval_attempts.jsonl")}
    trained = {r["task"] for r in read_jsonl(tmp_path / "count" / "rollouts.jsonl")}
    assert evaluated == {f"circles-s1-{i:03d}" for i in range(8)} and not evaluated & trained


def test_a_local_text_model_has_no_processor_without_loading_its_config(
    tiny_llama_path: Path, vlm_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A text model's config.json says so by itself; a vision model's still goes through transformers."""
    import transformers

    loaded: list[str] = []
    real = transformers.AutoConfig.from_pretrained
    monkeypatch.setattr(
        transformers.AutoConfig,
        "from_pretrained",
        lambda source, **kw: loaded.append(source) or real(source, **kw),
    )
    assert load_processor(str(tiny_llama_path)) is None
    assert loaded == []
    assert load_processor(str(vlm_path)) is not None
    assert str(vlm_path) in loaded
