"""Base model vs trained adapter on held-out conversations: what did the fine-tuning change?

Both models answer each held-out prompt greedily through the SDK (the one checkpoint-to-sampler path,
`loops_nb.run_checkpoints`), and each reply is scored against the reference turn as a `tool_call`, a
`direct_answer` or `text`. Deliberate simplification: one greedy sample per turn, no tool execution. The use
and the rules: docs/reference/sft.md#comparing-the-base-model-and-the-adapter.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import JsonValue

from loops_nb.compute import LoopsConnection
from loops_nb.errors import UserError
from loops_nb.llm.chat_messages import ParsedReply
from loops_nb.llm.templates import parse_assistant_text
from loops_nb.model_renderer import load_model_tokenizer, run_renderer_choice, text_renderer
from loops_nb.run.run_outcome import Outcome
from loops_nb.run_checkpoints import checkpoint_sampling_client, find_checkpoint
from loops_nb.run_dir import RunDirectory
from loops_nb.sft.batching import is_held_out, require_data_file
from loops_nb.sft.config import SFTConfig
from loops_nb.sft.data import ChatRow, Message, RowResult, read_rows
from loops_nb.sft.survival import split_inline_reasoning

if TYPE_CHECKING:
    import pandas as pd
    from baseten.loops import SamplingClient, SamplingParams

    from loops_nb.project import Project

COLUMNS = (
    "row", "turn", "kind", "reference", "base_reply", "adapter_reply",
    "base_score", "adapter_score", "base_exact", "adapter_exact",
)  # fmt: skip
SCORING = (
    "tool_call: same tools and arguments in any order (strings stripped and case-insensitive, numbers as "
    "numbers); direct_answer: no tool call or tool markup, non-empty reply; text: equal after lower-casing, "
    "collapsing whitespace and dropping punctuation at the ends"
)
_EDGE_PUNCTUATION = " \t\n.,;:!?\"'`()[]"
_TOOL_MARKUP = re.compile(r"</?\s*(tool_call|tool_response|tools)\s*>", re.IGNORECASE)


def normalise_text(text: str | None) -> str:
    """The text rule: reasoning removed, lower case, whitespace collapsed, punctuation at the ends dropped."""
    answer = split_inline_reasoning(text or "")[1]
    return re.sub(r"\s+", " ", answer.casefold()).strip(_EDGE_PUNCTUATION)


def _normalise_value(value: JsonValue) -> JsonValue:
    if isinstance(value, str):
        return value.strip().casefold()
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, list):
        return [_normalise_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _normalise_value(v) for k, v in value.items()}
    return value


def _call_key(name: str, arguments: JsonValue) -> str:
    return json.dumps({"name": name, "arguments": _normalise_value(arguments)}, sort_keys=True)


def score_reply(
    reply: str, reference: Message, *, has_tools: bool, parsed: ParsedReply | None = None
) -> tuple[str, float, float | None]:
    """``(kind, score, exact)`` of a generated reply against the reference assistant turn (the rules:
    docs/reference/sft.md).

    ``parsed``: the reply as the run's renderer parsed its tokens (what `compare` passes, so evaluation reads
    replies as sampling does); without it the text is parsed as a chat template's reply."""
    parsed = parse_assistant_text(reply) if parsed is None else parsed
    errors = list(parsed.tool_call_errors)
    # Tool markup left in the prose (a hallucinated <tool_response> block, a stray </tool_call>) is neither an
    # answer nor a call: only blocks that parse as calls count, and they are no longer in the content.
    if _TOOL_MARKUP.search(parsed.content):
        errors.append("tool markup outside a parsed <tool_call> block")
    if reference.tool_calls:
        want = sorted(_call_key(c.function.name, c.function.arguments) for c in reference.tool_calls)
        calls = [c["function"] for c in parsed.tool_calls]
        got = sorted(_call_key(fn["name"], json.loads(fn["arguments"])) for fn in calls)
        return "tool_call", float(got == want and not errors), None
    exact = float(not parsed.tool_calls and normalise_text(parsed.content) == normalise_text(reference.text))
    if has_tools:
        return "direct_answer", float(not parsed.tool_calls and not errors and bool(parsed.content)), exact
    return "text", exact, exact


def reference_text(message: Message) -> str:
    """The reference turn as readable text: its content, then its tool calls as ``name(arguments)``."""
    parts = [message.text] if message.text else []
    for call in message.tool_calls or ():
        parts.append(f"{call.function.name}({json.dumps(call.function.arguments, ensure_ascii=False)})")
    return "\n".join(parts)


@dataclass
class Comparison:
    """The compared turns and the summary."""

    table: pd.DataFrame
    """One line per compared turn, with the columns in `COLUMNS`."""
    source: str
    max_tokens: int

    def by_kind(self) -> pd.DataFrame:
        """Turns and mean scores per kind (tool_call, direct_answer, text)."""
        grouped = self.table.groupby("kind", sort=True)
        return grouped.agg(
            turns=("row", "size"), base=("base_score", "mean"), adapter=("adapter_score", "mean")
        ).reset_index()

    def describe(self) -> list[str]:
        lines = [
            f"comparison: {len(self.table)} held-out turn(s) of {self.source}, greedy, max_tokens {self.max_tokens}",
            f"scoring: {SCORING}",
            f"accuracy: base {self.table['base_score'].mean():.2f}, adapter {self.table['adapter_score'].mean():.2f}",
        ]
        for kind in self.by_kind().itertuples():
            lines.append(f"  {kind.kind} ({kind.turns}): base {kind.base:.2f}, adapter {kind.adapter:.2f}")
        exact = self.table.dropna(subset=["base_exact"])
        if len(exact):
            lines.append(
                f"  wording matches the reference (turns without a tool call, {len(exact)}): "
                f"base {exact['base_exact'].mean():.2f}, adapter {exact['adapter_exact'].mean():.2f}"
            )
        return lines


def held_out_rows(
    config: SFTConfig, limit: int, config_path: Path | None = None
) -> tuple[str, Iterator[ChatRow]]:
    """The first ``limit`` valid held-out chat rows, streamed, and where they come from."""
    d = config.data
    path = d.eval if d.eval is not None else d.train
    require_data_file(path, "data.eval" if d.eval else "data.train", config_path)
    if d.eval is None and d.eval_fraction <= 0:
        raise UserError("compare needs held-out rows: set data.eval or data.eval_fraction > 0")

    rows: Iterator[RowResult] = read_rows(path)
    if d.eval is None:
        rows = (
            r
            for r in itertools.islice(rows, d.max_rows)
            if is_held_out(r.row_number, d.shuffle_seed, d.eval_fraction)
        )
    source = path.name if d.eval is not None else f"the held-out rows of {path.name}"
    return source, itertools.islice(
        (r for r in rows if isinstance(r, ChatRow)), max(limit, 1)
    )  # one at least


async def _sample(
    client: SamplingClient, prompt: list[int], params: SamplingParams, gate: asyncio.Semaphore
) -> list[int]:
    from baseten.loops import ModelInput

    async with gate:
        response = await client.sample_async(
            ModelInput.from_ints(prompt), num_samples=1, sampling_params=params
        )
    return list(response.sequences[0].tokens)


async def compare(
    project: Project,
    run: Outcome | str | Path | None = None,
    *,
    rows: int = 20,
    turns: Literal["last", "all"] = "last",
    max_tokens: int = 256,
    concurrency: int = 8,
) -> Comparison:
    """Sample the base model and the run's adapter on ``rows`` held-out conversations and score both."""
    import pandas as pd
    from baseten.loops import SamplingParams

    if project.config.recipe != "sft":
        raise UserError(f"compare is for SFT runs; {project.path} is a {project.config.recipe} config")
    config = project.config_as(SFTConfig)
    if isinstance(run, Outcome):
        run = run.run_dir
    # ``run`` (its `Outcome` or directory), else the config's run; a run without a checkpoint is refused.
    run_dir = RunDirectory.existing(run if run is not None else project.run_dir())
    checkpoint = find_checkpoint(run_dir, "latest")
    tokenizer = await asyncio.to_thread(
        load_model_tokenizer, config.model, config.compute.scope, cache_dir=config.compute.local.cache_dir
    )
    choice = run_renderer_choice(config.model, run_dir.read_run_json())  # as the run trained
    renderer = text_renderer(config.model, tokenizer, choice)
    source, row_iter = held_out_rows(config, rows, project.path)
    items = []
    for row in row_iter:
        trained = row.trained_turns if turns == "all" else row.trained_turns[-1:]
        messages, tools = row.template_messages(), row.template_tools()
        for j in trained:
            prompt = renderer.prompt_tokens(messages[:j], tools)
            if len(prompt) + max_tokens <= config.model.max_seq_len:
                items.append((row, j, prompt))
    if not items:
        raise UserError(
            f"no held-out turn of {source} fits max_seq_len {config.model.max_seq_len} to compare"
        )
    params = SamplingParams(
        max_tokens=max_tokens, temperature=0.0, stop=list(renderer.stop_token_ids), seed=0
    )
    gate = asyncio.Semaphore(concurrency)
    connection = await LoopsConnection.open(config.compute, state_dir=run_dir.state / "local_loops")
    try:
        base = await checkpoint_sampling_client(connection, config.model, None)
        adapter = await checkpoint_sampling_client(connection, config.model, checkpoint)
        replies = await asyncio.gather(
            *(_sample(client, prompt, params, gate) for _, _, prompt in items for client in (base, adapter))
        )
    finally:
        await connection.close()
    records = []
    for k, (row, j, prompt) in enumerate(items):
        reference = row.messages[j]
        sampled = replies[2 * k : 2 * k + 2]
        texts = [renderer.decode(tokens, skip_special=True) for tokens in sampled]
        # Parsed by the renderer that rendered the prompt, as a run's replies are (SFT trained through it).
        parsed = [renderer.parse(t, prompt_tokens=prompt, tools=row.template_tools()) for t in sampled]
        kinds, scores, exact = zip(
            *(
                score_reply(text, reference, has_tools=bool(row.tools), parsed=reply)
                for text, reply in zip(texts, parsed, strict=True)
            ),
            strict=True,
        )  # each (base, adapter); a record lists COLUMNS in order
        records.append((row.row_number, j, kinds[0], reference_text(reference), *texts, *scores, *exact))
    return Comparison(pd.DataFrame(records, columns=list(COLUMNS)), source, max_tokens)
