"""TargetPreview: tokens coloured by loss weight, from SFT examples and RL captures."""

from __future__ import annotations

import html as htmllib
import re
from typing import Any

import pytest
from widget_fixtures import assert_static_html

from loops_nb.llm.capture import ModelCall, TokenCapture
from loops_nb.sft.data import parse_row
from loops_nb.sft.report import CheckReport
from loops_nb.sft.targets import RenderedRow, chat_targets
from loops_nb.widgets import TargetPreview, TokenCounts, TokenSequence

SPAN = re.compile(r'<span title="([^"]*)" style="([^"]*)">(.*?)</span>', re.S)
ROW = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris is the capital of France."},
    ]
}


def rendered(tok: Any, row: dict = ROW, number: int = 1) -> RenderedRow:
    result = chat_targets(tok).render(parse_row(row, number))
    assert isinstance(result, RenderedRow), result
    return result


def spans(html: str) -> list[tuple[str, str, str]]:
    """(title, style, text) of every token span, HTML entities decoded."""
    return [(htmllib.unescape(t), s, htmllib.unescape(x)) for t, s, x in SPAN.findall(html) if "#" in t]


def test_sft_example_trained_and_masked(tokenizer: Any) -> None:
    row = rendered(tokenizer)
    example = row.examples[0]
    preview = TargetPreview(row, tokenizer)
    html = preview.to_html()
    assert_static_html(html)
    n, trained = example.n_tokens, example.n_trained
    assert f"row 1 · trains messages[2]: {n} tokens, {trained} trained, {n - trained} masked" in html
    token_spans = spans(html)
    titles = [t for title, _, _ in token_spans for t in title.split("\n")]
    assert len(titles) == n  # every token has its hover line
    assert titles[0] == f"#0 id={example.input_ids[0]} weight=0 '<|im_start|>'"
    green = [s for s in token_spans if "rgba(46,160,67,0.750)" in s[1]]
    assert sum(len(t.split("\n")) for t, _, _ in green) == trained
    assert all("transparent" in s for _, s, _ in token_spans if s not in {g[1] for g in green})
    assert "(messages[2])" in green[0][0]  # the hover names the trained turn
    assert "".join(text for _, _, text in green) == "Paris is the capital of France.<|im_end|>"
    assert "↵<br>" in html  # newlines are visible

    text = str(preview)
    assert "[[Paris is the capital of France.<|im_end|>]]" in text
    assert text.endswith(f"({n} tokens, {trained} trained)")
    assert (
        repr(preview)
        == f"TargetPreview(1 sequence, {n} tokens, {trained} trained, {n - trained} not trained)"
    )
    assert preview._repr_mimebundle_()["text/plain"] == text


def test_multibyte_characters_are_not_split(tokenizer: Any) -> None:
    text = "Héllo 日本 🙂\n\tthe end"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)  # the tokenizer does split these characters
    preview = TargetPreview(TokenSequence(ids, [1.0] * len(ids), "utf8"), tokenizer)
    pieces = preview.pieces(0)
    assert "".join(p.text for p in pieces) == text
    shown = spans(preview.to_html())
    assert not any("\ufffd" in text for _, _, text in shown)
    emoji = next(title for title, _, text in shown if text == "🙂")
    assert emoji.count("(part of '🙂')") == 4  # one span; its hover lists the four byte tokens
    assert "→" in preview.to_html()
    assert str(preview).splitlines()[1] == "[[Héllo 日本 🙂"

    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    by_offsets = TargetPreview(
        TokenSequence(enc["input_ids"], [1.0] * len(ids), text=text, offsets=enc["offset_mapping"]), tokenizer
    )
    assert [p.text for p in by_offsets.pieces(0)] == [p.text for p in pieces]


def test_weights_colours_and_truncation(tokenizer: Any) -> None:
    ids = tokenizer.encode("the quick brown fox jumps over the lazy dog", add_special_tokens=False)
    weights = [0.0, 0.5, -1.0] + [1.0] * (len(ids) - 3)
    preview = TargetPreview(TokenSequence(ids, weights, "adv"), tokenizer, max_tokens=4)
    token_spans = spans(preview.to_html())
    assert len(token_spans) == 4
    assert "transparent" in token_spans[0][1]
    assert "rgba(46,160,67,0.500)" in token_spans[1][1]  # α = 0.25 + 0.5·0.5
    assert "rgba(218,54,51,0.750)" in token_spans[2][1]
    more = len(ids) - 4
    assert f"… {more} more tokens ({more} trained)" in preview.to_html()
    text = str(preview)
    assert "[[-" in text and "-]]" in text and f"… {more} more tokens" in text
    assert "1 negative" in text.splitlines()[0]


def test_rl_captures(tokenizer: Any) -> None:
    prompt = tokenizer.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
    completion = tokenizer.encode("hello world<|im_end|>")
    capture = TokenCapture()
    call = ModelCall(prompt, completion, [-0.5] * len(completion), policy_version=3, finish_reason="stop")
    capture.record(call)
    for item in (
        capture,
        capture.sequences()[0],
        call,
        {"prompt_tokens": prompt, "completion_tokens": completion},
    ):
        preview = TargetPreview(item, tokenizer)
        seq = preview.sequences[0]
        assert seq.n_trained == len(completion) and len(seq.input_ids) == len(prompt) + len(completion)
        assert "[[hello world<|im_end|>]]" in str(preview)
    transcript_call = {"prompt": "<|im_start|>user\nhello<|im_end|>\n", "completion_tokens": completion}
    preview = TargetPreview(transcript_call, tokenizer)
    assert "re-tokenized" in preview.to_html()


def test_check_report_samples_and_token_counts(tokenizer: Any) -> None:
    rows = [parse_row(ROW, i) for i in range(1, 6)]
    report = CheckReport.build(rows, chat_targets(tokenizer), batch_size=2, n_samples=2)
    preview = TargetPreview(report, tokenizer, max_sequences=1)
    assert len(preview.sequences) == 1 and preview.hidden_sequences == 1
    assert "… 1 more sequence" in str(preview)

    counts = TokenCounts.from_report(report)
    bundle = counts._repr_mimebundle_()
    assert bundle["text/plain"].startswith(f"dataset: {report.tokens:,} tokens, {report.trained_tokens:,}")
    assert f"{report.untrained_tokens:,}" in bundle["text/html"]
    assert_static_html(bundle["text/html"])
    assert "rows: train / split / refused" in str(counts)


def test_mismatched_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="3 weights for 2 tokens"):
        TokenSequence([1, 2], [0.0, 1.0, 1.0])
    with pytest.raises(TypeError):
        TargetPreview(42, None)
