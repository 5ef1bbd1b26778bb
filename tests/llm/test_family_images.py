"""Images through the family renderer (`renderers`' Qwen3-VL renderer) on Qwen3-VL's real vocabulary and
processor classes (tests/qwen3_vl_model.py): through the gateway's Chat Completions and Responses APIs, across
turns, and as SFT targets.

The aim is one exact sequence: the prompt the sampler got (image placeholders included) plus the completion are
the tokens the trainer gets, and the SFT example of the same conversation is those tokens, training the same
ones. Replies come from a scripted sampler (tests/scripted_policy.py).
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Callable
from typing import Any

import openai
import pytest
from qwen3_vl_model import HUB_ID, qwen3_vl_processor
from scripted_policy import IMAGE_POSITION, ScriptedPolicy

from loops_nb.errors import UserError
from loops_nb.llm.capture import TokenCapture
from loops_nb.llm.client import LoopsLLM, SamplingDefaults
from loops_nb.llm.model_input import model_input
from loops_nb.llm.prime_renderer import PrimeRenderer
from loops_nb.model_access import ModelGateway
from loops_nb.rl.datums import sequence_datums
from loops_nb.sft.data import RefusedRow, iter_rows, read_rows
from loops_nb.sft.evaluation import example_datum
from loops_nb.sft.targets import RenderedRow, SFTTargets

pytestmark = pytest.mark.asyncio(loop_scope="session")

REPLIES = ["There are 3 circles.", "This one has 5."]


@pytest.fixture(scope="module")
def renderer(family_tokenizer: Callable[[str], Any]) -> PrimeRenderer:
    return PrimeRenderer(family_tokenizer("qwen3"), "qwen3-vl", hub_id=HUB_ID, processor=qwen3_vl_processor())


@pytest.fixture(scope="module")
def gateway() -> Any:
    with ModelGateway(model_name="policy") as gw:
        yield gw


def png_url(size: tuple[int, int], color: tuple[int, int, int]) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


RED, BLUE = png_url((120, 90), (200, 30, 30)), png_url((64, 64), (30, 30, 200))


def attempt(renderer: PrimeRenderer) -> tuple[LoopsLLM, ScriptedPolicy]:
    end = renderer.tokenizer.convert_tokens_to_ids("<|im_end|>")  # a completion ends with its stop token
    policy = ScriptedPolicy(renderer, list(REPLIES), logprob=-0.5, end_token=end)
    return LoopsLLM(renderer, policy, TokenCapture(), SamplingDefaults(max_tokens=16)), policy


def chat_turn(url: str, text: str) -> dict[str, Any]:
    return {
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}],
    }


async def by_chat(gateway: ModelGateway, llm: LoopsLLM, key: str) -> list[dict[str, Any]]:
    """Two turns, an image in each, through `/v1/chat/completions`; the conversation."""
    lease = gateway.issue(key, llm)
    client = openai.AsyncOpenAI(base_url=gateway.url, api_key=lease.key)
    messages: list[Any] = [chat_turn(RED, "How many circles?")]
    for follow_up in (chat_turn(BLUE, "And here?"), None):
        resp = await client.chat.completions.create(model="policy", messages=messages)
        messages.append({"role": "assistant", "content": resp.choices[0].message.content})
        if follow_up:
            messages.append(follow_up)
    gateway.revoke(lease.key)
    return messages


async def by_responses(gateway: ModelGateway, llm: LoopsLLM, key: str) -> None:
    """The same two turns through `/v1/responses`, images as `input_image` parts."""
    lease = gateway.issue(key, llm)
    client = openai.AsyncOpenAI(base_url=gateway.url, api_key=lease.key)
    items: list[Any] = []
    for url, text in ((RED, "How many circles?"), (BLUE, "And here?")):
        content = [
            {"type": "input_image", "image_url": url, "detail": "auto"},
            {"type": "input_text", "text": text},
        ]
        items.append({"role": "user", "content": content})
        resp = await client.responses.create(model="policy", input=items)
        items += [o.model_dump(exclude_none=True) for o in resp.output]
    gateway.revoke(lease.key)


async def test_images_through_the_gateway_are_one_exact_sequence(
    gateway: ModelGateway, renderer: PrimeRenderer
) -> None:
    llm, policy = attempt(renderer)
    messages = await by_chat(gateway, llm, "t/vision/chat")
    first, second = llm.capture.calls
    assert [m["content"] for m in messages if m["role"] == "assistant"] == REPLIES
    # Each image is its run of <|image_pad|> tokens, as long as the processor makes it (120x90 px -> 12).
    pad = renderer.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    grid = renderer.processor.image_processor(images=[load(RED)], return_tensors="np")["image_grid_thw"][0]
    [red] = first.images
    assert red.length == int(grid.prod()) // 4 == 12
    assert first.prompt_tokens[red.offset - 1 : red.offset + red.length + 1] == [
        renderer.tokenizer.convert_tokens_to_ids("<|vision_start|>"),
        *[pad] * red.length,
        renderer.tokenizer.convert_tokens_to_ids("<|vision_end|>"),
    ]
    # The sampler got those tokens with the image chunk at the run (the chunk's positions are the run's).
    assert policy.prompts[0] == [IMAGE_POSITION if t == pad else t for t in first.prompt_tokens]
    # Turn two continues turn one exactly and carries its image; the new image follows.
    assert second.prompt_tokens[: len(first.prompt_tokens) + len(first.completion_tokens)] == (
        first.prompt_tokens + first.completion_tokens
    )
    assert second.images[0] == red and second.images[1].offset > len(first.prompt_tokens)
    assert not llm.capture.breaks, llm.capture.breaks
    [seq] = llm.capture.sequences()
    assert seq.tokens == second.prompt_tokens + second.completion_tokens
    assert seq.images == list(second.images)
    # What the trainer gets: the same tokens, each image a chunk at its run.
    chunks = model_input(seq.tokens, seq.images).chunks
    assert [c.expected_tokens for c in chunks if c.type == "image"] == [im.length for im in seq.images]
    assert sum(len(c.tokens) if c.type == "encoded_text" else c.expected_tokens for c in chunks) == len(
        seq.tokens
    )


async def test_the_sft_row_of_a_sampled_image_turn_trains_what_was_sampled(
    gateway: ModelGateway, renderer: PrimeRenderer
) -> None:
    llm, _ = attempt(renderer)
    messages = await by_chat(gateway, llm, "t/vision/sft-twin")
    [seq] = llm.capture.sequences()
    # The conversation as an SFT row trains both replies; its one example is the sampled sequence, its
    # datum the RL datum's input with the same image chunks.
    [result] = SFTTargets(renderer).render_rows(iter_rows([{"messages": messages}]))
    assert isinstance(result, RenderedRow), result
    [example] = result.examples
    assert example.input_ids == seq.tokens
    assert [w > 0 for w in example.weights] == seq.sampled
    assert example.images == tuple(seq.images)
    [rl] = sequence_datums([seq], 1.0, "images")
    assert example_datum(example).model_input == rl.to_datum().model_input


async def test_an_sft_image_path_is_read_beside_its_data_file(
    renderer: PrimeRenderer, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dataset names its images relative to its own file: the row trains the same example as the same image
    inline, whatever the working directory."""
    data = tmp_path / "data"
    (data / "images").mkdir(parents=True)
    (data / "images" / "red.png").write_bytes(base64.b64decode(RED.partition(",")[2]))

    def row(url: str) -> dict[str, Any]:
        image = {"type": "image_url", "image_url": {"url": url}}
        text = {"type": "text", "text": "How many circles?"}
        return {
            "messages": [{"role": "user", "content": [image, text]}, {"role": "assistant", "content": "3"}]
        }

    (data / "train.jsonl").write_text(json.dumps(row("images/red.png")) + "\n")
    monkeypatch.chdir(tmp_path / "data" / "images")  # a relative path read from here would miss
    [from_file] = SFTTargets(renderer).render_rows(read_rows(data / "train.jsonl"))
    [inline] = SFTTargets(renderer).render_rows(iter_rows([row(RED)]))
    assert isinstance(from_file, RenderedRow) and isinstance(inline, RenderedRow), (from_file, inline)
    [a], [b] = from_file.examples, inline.examples
    assert (a.input_ids, a.weights) == (b.input_ids, b.weights)
    assert example_datum(a).model_input == example_datum(b).model_input


async def test_an_image_row_on_a_chat_template_is_refused_in_one_line(tiny_chat_model_path: Any) -> None:
    from transformers import AutoTokenizer

    from loops_nb.sft.targets import chat_targets

    targets = chat_targets(AutoTokenizer.from_pretrained(tiny_chat_model_path))
    row = {"messages": [chat_turn(RED, "How many?"), {"role": "assistant", "content": "3"}]}
    [result] = targets.render_rows(iter_rows([row]))
    assert isinstance(result, RefusedRow) and "train only through a family's image renderer" in result.reason


async def test_input_image_parts_through_the_responses_api_train_the_same_tokens(
    gateway: ModelGateway, renderer: PrimeRenderer
) -> None:
    via_chat, _ = attempt(renderer)
    await by_chat(gateway, via_chat, "t/vision/twin-chat")
    via_responses, _ = attempt(renderer)
    await by_responses(gateway, via_responses, "t/vision/twin-responses")
    a, b = via_chat.capture, via_responses.capture
    assert [(c.prompt_tokens, c.completion_tokens, c.images) for c in a.calls] == [
        (c.prompt_tokens, c.completion_tokens, c.images) for c in b.calls
    ]
    assert not b.breaks and len(b.sequences()) == 1


async def test_a_text_family_refuses_an_image_in_one_line(family_tokenizer: Callable[[str], Any]) -> None:
    text_only = PrimeRenderer(family_tokenizer("qwen3"), "qwen3", hub_id="Qwen/Qwen3-8B")
    with pytest.raises(UserError, match="no image renderer for 'qwen3'"):
        text_only.render_prompt([chat_turn(RED, "How many?")])


def load(url: str) -> Any:
    from loops_nb.llm.vision import load_image

    return load_image(url)


@pytest.mark.slow
async def test_a_qwen3_vl_samples_and_trains_an_image_attempt_on_the_local_scope(
    gateway: ModelGateway, family_tokenizer: Callable[[str], Any], embedded_loops: Any, tmp_path_factory: Any
) -> None:
    """The tiny Qwen3-VL in the embedded Loops: the gateway's two-image attempt sampled by the real sampler,
    then trained: the trainer's logprobs of the sampled tokens are the sampler's (the image chunks expand to
    the runs the family's renderer made)."""
    from baseten.loops import AdamParams
    from qwen3_vl_model import build_qwen3_vl

    from loops_nb.rl.policy import Policy

    path = build_qwen3_vl(tmp_path_factory.mktemp("qwen3_vl"))
    renderer = PrimeRenderer(family_tokenizer("qwen3"), "qwen3-vl", hub_id=HUB_ID, processor=str(path))
    trainer = await embedded_loops.service_client().create_lora_training_client_async(
        base_model=str(path), rank=8, seed=0
    )
    policy = Policy(trainer, str(path))
    await policy.publish()
    llm = LoopsLLM(renderer, policy, TokenCapture(), SamplingDefaults(max_tokens=6), seed=0)
    lease = gateway.issue("t/vision/local", llm)
    client = openai.AsyncOpenAI(base_url=gateway.url, api_key=lease.key)
    messages: list[Any] = [chat_turn(RED, "How many circles?")]
    resp = await client.chat.completions.create(model="policy", messages=messages)
    messages += [resp.choices[0].message.model_dump(exclude_none=True), chat_turn(BLUE, "And here?")]
    await client.chat.completions.create(model="policy", messages=messages)
    gateway.revoke(lease.key)
    assert len(llm.capture.calls) == 2
    [datum] = sequence_datums(llm.capture.sequences(), 1.0, "images")
    assert len(datum.images) == 2
    future = await trainer.forward_backward_async([datum.to_datum()], "importance_sampling")
    out = await future.result_async()
    trained = out.loss_fn_outputs[0]["logprobs"].data
    pairs = [(t, s) for t, s, m in zip(trained, datum.logprobs[1:], datum.sampled[1:], strict=True) if m]
    assert pairs and max(abs(t - s) for t, s in pairs) < 1e-3, pairs
    step = await trainer.optim_step_async(AdamParams(learning_rate=1e-3))
    assert await step.result_async() is not None
