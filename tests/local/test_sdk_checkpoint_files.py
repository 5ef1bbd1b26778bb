"""Checkpoint files, standalone checkpoint samplers, deactivation and unserved routes, through the SDK only.

Each test drives `baseten.loops` exactly as a script on Baseten would: `create_sampling_client(model_path=)`,
`get_checkpoint_archive_url` and `download_checkpoint` must work against the embedded Loops, a deactivated
run's clients must be told so, and a route the local Loops does not serve must say so in JSON.
"""

from __future__ import annotations

import json

import httpx
import pytest
from baseten.loops import AdamParams, Datum, ModelInput, SamplingParams, TensorData

GREEDY = SamplingParams(max_tokens=6, temperature=0.0)


def _datum(tokens: list[int]) -> Datum:
    inp, tgt = tokens[:-1], tokens[1:]
    return Datum(
        model_input=ModelInput.from_ints(inp),
        loss_fn_inputs={"target_tokens": TensorData(data=tgt, dtype="int64", shape=[len(tgt)])},
    )


@pytest.fixture(scope="module")
def svc(embedded_loops):
    return embedded_loops.service_client()


@pytest.fixture(scope="module")
def tokens(tiny_chat_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_chat_model).encode(
        "checkpoints travel as files, not as promises"
    )


@pytest.fixture(scope="module")
def trained(svc, tiny_chat_model, tokens):
    """A run trained two steps, with sampler weights and trainer state saved under known names."""
    tc = svc.create_lora_training_client(base_model=str(tiny_chat_model), rank=4, seed=0, max_seq_len=64)
    for _ in range(2):
        tc.forward_backward([_datum(tokens)], loss_fn="cross_entropy").result()
        tc.optim_step(AdamParams(learning_rate=2e-2)).result()
    sampler_path = tc.save_weights_for_sampler("files-2").result().path
    state_path = tc.save_state("state-2").result().path
    yield tc, sampler_path, state_path
    tc.close()


def test_max_seq_len_is_kept_for_the_run_and_reported(svc, trained, embedded_loops, tiny_chat_model):
    tc, _, _ = trained
    assert tc.get_info().max_seq_len == 64
    runs = httpx.get(
        f"{embedded_loops.url}/v1/loops/runs", headers={"Authorization": f"Api-Key {embedded_loops.api_key}"}
    ).json()["runs"]
    assert next(r for r in runs if r["id"] == tc.run_id)["max_seq_len"] == 64
    with pytest.raises(Exception, match="exceed this run's limit of 64"):
        tc.forward([_datum(list(range(3, 80)))], loss_fn="cross_entropy").result()
    capabilities = {m.model_name: m for m in svc.get_server_capabilities().supported_models}
    assert capabilities[str(tiny_chat_model)].max_context_length == 512  # the tiny model's config


def test_a_standalone_sampler_serves_saved_sampler_weights(svc, trained, tokens):
    tc, sampler_path, _ = trained
    paired = tc.create_sampling_client(sampler_path)
    standalone = svc.create_sampling_client(model_path=sampler_path)
    prompt = ModelInput.from_ints(tokens[:5])
    expected = paired.sample(prompt, 1, GREEDY).sequences[0]
    got = standalone.sample(prompt, 1, GREEDY).sequences[0]
    assert got.tokens == expected.tokens
    assert got.logprobs == pytest.approx(expected.logprobs, abs=1e-4)
    with pytest.raises(httpx.HTTPStatusError, match="not sampler weights"):
        svc.create_sampling_client(model_path=tc.save_state("not-sampler").result().path)


def test_archive_urls_and_download_give_the_peft_adapter(svc, trained, tmp_path):
    from safetensors.torch import load_file

    tc, _, _ = trained
    checkpoints = {c.checkpoint_id: c for c in svc.list_checkpoints(tc.run_id)}
    sampler_ckpt = checkpoints["files-2"]
    page = svc.get_checkpoint_archive_url(checkpoint_id=sampler_ckpt.id)
    names = {f.relative_file_name for f in page.presigned_urls}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= names
    assert "checkpoint.json" not in names and page.total_count == len(names)
    # The links work without the API key (as presigned URLs do), and only as signed.
    link = next(f for f in page.presigned_urls if f.relative_file_name == "adapter_config.json")
    assert json.loads(httpx.get(link.url).content)["r"] == 4
    assert httpx.get(link.url.replace("signature=", "signature=0")).status_code == 403
    one = svc.get_checkpoint_archive_url(name="files-2", run_id=tc.run_id, page_size=1)
    assert len(one.presigned_urls) == 1 and one.next_page_token == 1

    download = svc.download_checkpoint(name="files-2", run_id=tc.run_id, dest_dir=str(tmp_path / "adapter"))
    assert download.file_count == len(names)
    weights = load_file(download.dest_dir / "adapter_model.safetensors")
    assert weights and all("lora_" in key for key in weights)
    state = svc.download_checkpoint(checkpoint_id=checkpoints["state-2"].id, dest_dir=str(tmp_path / "state"))
    assert (state.dest_dir / "adapter" / "adapter_model.safetensors").is_file()
    assert (state.dest_dir / "optimizer.pt").is_file()
    with pytest.raises(httpx.HTTPStatusError, match="no checkpoint with id 'ckpt-nope'"):
        svc.get_checkpoint_archive_url(checkpoint_id="ckpt-nope")


def test_every_client_of_a_deactivated_run_is_told_so(svc, embedded_loops, tiny_chat_model, tokens):
    from loops_nb.compute import deactivate_run

    tc = svc.create_lora_training_client(base_model=str(tiny_chat_model), rank=4, seed=0)
    version_zero = tc.save_weights_and_get_sampling_client("v0")  # no optim_step: no version floor
    tc.forward_backward([_datum(tokens)], loss_fn="cross_entropy").result()
    tc.optim_step(AdamParams(learning_rate=1e-2)).result()
    version_one = tc.save_weights_and_get_sampling_client("v1")
    saved = tc.save_weights_for_sampler("kept").result().path
    prompt = ModelInput.from_ints(tokens[:4])
    version_zero.sample(prompt, 1, GREEDY)
    deactivate_run(tc.run_id, embedded_loops.url, embedded_loops.api_key)

    for client in (version_zero, version_one):
        with pytest.raises(httpx.HTTPStatusError, match=f"run {tc.run_id} was deactivated") as err:
            client.sample(prompt, 1, GREEDY)
        assert err.value.response.status_code == 422
    with pytest.raises(httpx.HTTPStatusError, match="was deactivated"):
        tc.optim_step(AdamParams(learning_rate=1e-2)).result()
    with pytest.raises(httpx.HTTPStatusError, match="was deactivated"):
        _ = tc.policy_version
    # Its saved weights outlive it, through a standalone sampler.
    assert svc.create_sampling_client(model_path=saved).sample(prompt, 1, GREEDY).sequences[0].tokens


@pytest.mark.parametrize(
    ("method", "path", "reason"),
    [
        ("GET", "/v1/teams", "teams are a Baseten workspace concept"),
        ("POST", "/v1/loops/debug/trainers", "the internal debug route"),
        ("GET", "/v1/loops/nothing-here", "no such route"),
        ("DELETE", "/v1/loops/sessions", "no such route"),
    ],
)
def test_unserved_routes_answer_json_that_names_them(embedded_loops, method, path, reason):
    resp = httpx.request(
        method, embedded_loops.url + path, headers={"Authorization": f"Api-Key {embedded_loops.api_key}"}
    )
    assert resp.status_code == 422
    assert resp.json()["detail"].startswith(f"{method} {path} is not served by the local Loops: {reason}")


def test_a_team_scoped_client_fails_at_once_with_the_reason(embedded_loops):
    from baseten.loops import ServiceClient

    with pytest.raises(httpx.HTTPStatusError, match="GET /v1/teams is not served by the local Loops"):
        ServiceClient(base_url=embedded_loops.url, api_key=embedded_loops.api_key, team="research")
