"""SFT data contracts (chat and tokenized rows: docs/reference/sft.md#data-contracts), and a streaming reader.

`read_rows` never loads the file: it reads one line at a time and yields a parsed row or a `RefusedRow` whose
reason names the line and the field at fault, so one bad row never stops the others. Whether a row *trains* also
depends on the renderer; that is decided in `loops_nb.sft.targets`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from loops_nb.errors import DataError, UserError
from loops_nb.llm.chat_messages import is_image_part
from loops_nb.sft.refusal_wording import FIRST_TOKEN, MAX_DEPTH, unreadable, validation_reason
from loops_nb.validation_message import json_type, show

ROLES = ("system", "user", "assistant", "tool")
_BOM = b"\xef\xbb\xbf"
_CHAT_KEYS = frozenset({"messages", "tools"})
_TOKENIZED_KEYS = frozenset({"input_ids", "weights"})


class _Strict(BaseModel):
    # Unknown keys are refused rather than ignored: a typo like "tool" for "tools" must not silently drop data.
    model_config = ConfigDict(extra="forbid")


class _Row(_Strict):
    _row_number: int = PrivateAttr(default=0)

    @property
    def row_number(self) -> int:
        """1-based line number in the source file (0 when built in memory)."""
        return self._row_number


class FunctionCall(_Strict):
    """The function half of an OpenAI tool call. ``arguments`` may be a JSON string (as OpenAI sends it) or an
    object; it is kept as the parsed object, because chat templates render it with ``tojson``."""

    name: str = Field(min_length=1)
    arguments: dict[str, Any]

    @field_validator("arguments", mode="before")
    @classmethod
    def _parse_arguments(cls, value: object) -> object:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"not valid JSON ({exc.msg} at character {exc.pos})") from None
            except RecursionError:
                raise ValueError(f"JSON nested more than {MAX_DEPTH} levels deep") from None
            except ValueError as exc:  # e.g. an integer of more than 4300 digits
                raise ValueError(f"not valid JSON ({str(exc).split(';')[0]})") from None
            # The string was not seen by the row's own check: bound its depth and surrogates too.
            problem = unreadable(value, root="the decoded arguments")
            if problem:
                raise ValueError(problem)
        if not isinstance(value, dict):
            raise ValueError(f"must be a JSON object, got {json_type(value)}")
        return value


class ToolCall(_Strict):
    """One OpenAI tool call: ``{"id", "type": "function", "function": {"name", "arguments"}}``."""

    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDef(_Strict):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(_Strict):
    """An OpenAI function tool definition: ``{"type": "function", "function": {"name", ...}}``."""

    type: Literal["function"] = "function"
    function: FunctionDef


class Message(_Strict):
    """One chat message. Text parts are joined into ``content`` (parts with an image stay parts); which fields a
    role may hold is checked by `ChatRow`, so that the reason can say why (e.g. only assistant turns take a
    weight)."""

    role: str
    content: str | list[dict[str, object]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    # Not OpenAI, but the field HF reasoning templates (Qwen3, DeepSeek-R1) read; refused nowhere, checked for
    # survival like content.
    reasoning_content: str | None = None
    weight: int | None = None

    @field_validator("role", mode="before")
    @classmethod
    def _check_role(cls, value: object) -> object:
        if value not in ROLES:
            raise ValueError(f"unknown role {show(value)}; expected one of {', '.join(ROLES)}")
        return value

    @field_validator("content", mode="before")
    @classmethod
    def _join_text_parts(cls, value: object, info: ValidationInfo) -> object:
        if value is not None and not isinstance(value, str | list):  # one message for the str | list union
            raise ValueError(f"must be a string, got {json_type(value)}")
        if not isinstance(value, list):
            return value
        texts = []
        value = list(value)
        for i, part in enumerate(value):
            if is_image_part(part):
                from loops_nb.llm.vision import image_source

                try:
                    source = image_source(part)
                except UserError:
                    source = None
                if not isinstance(source, str):
                    raise ValueError(f"part {i}: an image part needs its URL, data URL or path as a string")
                value[i] = _image_beside(part, source, (info.context or {}).get("data_dir"))
                continue
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else json_type(part)
                raise ValueError(
                    f"part {i} is {show(kind)}; only text and image parts ({{'type': 'text', 'text': ...}}, "
                    "{'type': 'image_url', ...}) train"
                )
            if set(part) != {"type", "text"} or not isinstance(part["text"], str):
                raise ValueError(f"part {i} must be exactly {{'type': 'text', 'text': <string>}}")
            texts.append(part["text"])
        return value if len(texts) < len(value) else "".join(texts)

    @property
    def text(self) -> str | None:
        """The content's text: with images, its text parts joined."""
        if isinstance(self.content, list):
            return "".join(str(p["text"]) for p in self.content if p.get("type") == "text")
        return self.content

    @field_validator("weight", mode="before")
    @classmethod
    def _check_weight(cls, value: object) -> object:
        # OpenAI's contract is 0 or 1; True/False and 0.5 are refused rather than guessed at.
        if value is None or (type(value) in (int, float) and value in (0, 1)):
            return None if value is None else int(value)
        raise ValueError(f"must be 0 or 1, got {show(value)}")

    @property
    def trains(self) -> bool:
        """Whether this turn is a training target: assistant turns train unless their weight is 0."""
        return self.role == "assistant" and self.weight != 0


class ChatRow(_Row):
    """A chat row: messages, optional tools, and free-form ``metadata`` that is carried but never rendered."""

    messages: list[Message]
    tools: list[ToolDef] | None = None
    parallel_tool_calls: bool | None = None  # accepted for OpenAI compatibility; templates don't read it
    metadata: dict[str, Any] | None = None

    @property
    def trained_turns(self) -> list[int]:
        return [i for i, m in enumerate(self.messages) if m.trains]

    @model_validator(mode="after")
    def _check_conversation(self) -> ChatRow:
        if not self.messages:
            raise ValueError("messages: empty; a row needs at least one assistant turn")
        tool_names = [t.function.name for t in self.tools or ()]
        if len(set(tool_names)) != len(tool_names):
            dup = next(n for n in tool_names if tool_names.count(n) > 1)
            raise ValueError(f"tools: the tool {show(dup)} is defined twice")
        call_ids: set[str] = set()
        for i, m in enumerate(self.messages):
            _check_message(i, m, tool_names if self.tools else None, call_ids)
        if not any(m.role == "assistant" for m in self.messages):
            raise ValueError("messages: no assistant turn, so nothing trains")
        if not self.trained_turns:
            raise ValueError("messages: every assistant turn has weight 0, so nothing trains")
        return self

    def template_messages(self) -> list[dict[str, Any]]:
        """The messages as chat templates expect them (HF convention: absent keys rather than None values)."""
        out = []
        for m in self.messages:
            d: dict[str, Any] = {"role": m.role, "content": m.content if m.content is not None else ""}
            if m.name is not None:
                d["name"] = m.name
            if m.tool_calls:
                d["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": c.function.model_dump()}
                    for c in m.tool_calls
                ]
            if m.tool_call_id is not None:
                d["tool_call_id"] = m.tool_call_id
            if m.reasoning_content is not None:
                # HF aliases these: Qwen3/DeepSeek read reasoning_content, gpt-oss reads thinking.
                d["reasoning_content"] = d["thinking"] = m.reasoning_content
            out.append(d)
        return out

    def template_tools(self) -> list[dict[str, Any]] | None:
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None


def _check_message(i: int, m: Message, tool_names: list[str] | None, call_ids: set[str]) -> None:
    at = f"messages[{i}]"
    if m.weight is not None and m.role != "assistant":
        raise ValueError(f"{at}.weight: only assistant turns take a weight ({m.role} turns never train)")
    if m.tool_calls is not None and m.role != "assistant":
        raise ValueError(f"{at}.tool_calls: only assistant turns make tool calls")
    if m.reasoning_content is not None and m.role != "assistant":
        raise ValueError(f"{at}.reasoning_content: only assistant turns carry reasoning")
    if isinstance(m.content, list) and m.role != "user":
        raise ValueError(f"{at}.content: only user turns hold images")
    if m.role == "assistant":
        if not m.content and not m.tool_calls:
            raise ValueError(f"{at}: empty assistant turn (no content and no tool_calls)")
        for k, call in enumerate(m.tool_calls or ()):
            if tool_names is not None and call.function.name not in tool_names:
                # Listed as written when short and printable; a long or odd name is cut and quoted.
                named = ", ".join(n if n.isprintable() and len(n) <= 40 else show(n) for n in tool_names[:10])
                named += ", ..." if len(tool_names) > 10 else ""
                raise ValueError(
                    f"{at}.tool_calls[{k}].function.name: {show(call.function.name)} is not one of the row's "
                    f"tools ({named})"
                )
            call_ids.add(call.id)
    elif m.role == "tool":
        if m.tool_call_id is None:
            raise ValueError(f"{at}.tool_call_id: a tool message needs the id of the call it answers")
        if m.tool_call_id not in call_ids:
            raise ValueError(
                f"{at}.tool_call_id: {show(m.tool_call_id)} matches no earlier assistant tool call"
            )
        if m.content is None:
            raise ValueError(f"{at}.content: a tool message needs content (the tool's result)")
    else:
        if m.tool_call_id is not None:
            raise ValueError(f"{at}.tool_call_id: only tool messages answer a tool call")
        if m.content is None:
            raise ValueError(f"{at}.content: a {m.role} turn needs content")


class TokenizedRow(_Row):
    """An already tokenized row: ``input_ids`` and a loss weight per token (floats >= 0, same length)."""

    input_ids: list[int]
    weights: list[float]
    metadata: dict[str, Any] | None = None

    @field_validator("input_ids", mode="before")
    @classmethod
    def _check_ids(cls, value: object) -> object:
        # Checked by hand: pydantic's lax mode would accept "5" and 5.0, strict mode True.
        if not isinstance(value, list):
            raise ValueError(f"must be a list of token ids, got {json_type(value)}")
        for i, v in enumerate(value):
            if type(v) is not int or v < 0:
                raise ValueError(f"[{i}]: must be a token id (an integer >= 0), got {show(v)}")
        return value

    @field_validator("weights", mode="before")
    @classmethod
    def _check_weights(cls, value: object) -> object:
        if not isinstance(value, list):
            raise ValueError(f"must be a list of numbers, got {json_type(value)}")
        for i, v in enumerate(value):
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                raise ValueError(f"[{i}]: must be a finite number >= 0, got {show(v)}")
        return [float(v) for v in value]

    @model_validator(mode="after")
    def _check_lengths(self) -> TokenizedRow:
        if not self.input_ids:
            raise ValueError("input_ids: empty")
        if len(self.input_ids) != len(self.weights):
            raise ValueError(
                f"weights: {len(self.weights)} weights for {len(self.input_ids)} input_ids; they must match"
            )
        if not any(self.weights):
            raise ValueError("weights: all zero, so nothing trains; give the tokens to learn a weight > 0")
        if not any(self.weights[1:]):
            # A token's loss is the logprob of it given the tokens before it: input_ids[0] has none, so no
            # datum can target it (targets are input_ids[1:]).
            raise ValueError(
                f"weights: only input_ids[0] has a weight, and {FIRST_TOKEN}, or weight a later token"
            )
        return self


@dataclass(frozen=True, slots=True)
class RefusedRow:
    """A row that will not train, and why. ``row_number`` is the 1-based line in the file."""

    row_number: int
    reason: str


def _image_beside(part: dict[str, object], source: str, data_dir: Path | None) -> dict[str, object]:
    """``part`` with a relative image path made absolute against the data file's folder, so that a dataset
    and its images move together and the row reads the same from any working directory."""
    if data_dir is None or source.startswith(("data:", "http://", "https://")) or Path(source).is_absolute():
        return part
    from loops_nb.llm.vision import with_image_source

    return with_image_source(part, str((data_dir / Path(source).expanduser()).absolute()))


Row = ChatRow | TokenizedRow
RowResult = ChatRow | TokenizedRow | RefusedRow


def parse_row(obj: object, row_number: int = 0, data_dir: Path | None = None) -> RowResult:
    """Validate one decoded JSON value as a chat or tokenized row; never raises for bad data. Relative image
    paths are read from ``data_dir`` (the data file's folder) when given."""
    if not isinstance(obj, Mapping):
        return RefusedRow(row_number, f"a row must be a JSON object, got {json_type(obj)}")
    problem = unreadable(obj)
    if problem:
        return RefusedRow(row_number, problem)
    keys = set(obj)
    chat, tokenized = keys & _CHAT_KEYS, keys & _TOKENIZED_KEYS
    if chat and tokenized:
        return RefusedRow(
            row_number,
            f"the row mixes the chat format ({', '.join(sorted(chat))}) with the tokenized format "
            f"({', '.join(sorted(tokenized))}); use one per row",
        )
    model: type[ChatRow] | type[TokenizedRow]
    if "messages" in obj:
        model = ChatRow
    elif tokenized:
        model = TokenizedRow
    else:
        return RefusedRow(
            row_number, "the row has neither messages (chat) nor input_ids and weights (tokenized)"
        )
    try:
        row = model.model_validate(obj, context={"data_dir": data_dir})
    except ValidationError as exc:
        return RefusedRow(row_number, validation_reason(exc))
    row._row_number = row_number
    return row


def parse_line(line: bytes | str, row_number: int, data_dir: Path | None = None) -> RowResult:
    """Decode and validate one JSONL line. A leading UTF-8 byte order mark is skipped: editors on Windows write
    one at the start of a file, and ``cat`` of such files puts one at the start of later lines too."""
    try:
        text = (
            line.removeprefix(_BOM).decode("utf-8")
            if isinstance(line, bytes)
            else line.removeprefix("\ufeff")
        )
        obj = json.loads(text)
    except UnicodeDecodeError as exc:
        return RefusedRow(
            row_number, f"not UTF-8 text ({exc.reason} at byte {exc.start}); save the file as UTF-8"
        )
    except json.JSONDecodeError as exc:
        return RefusedRow(row_number, f"invalid JSON: {exc.msg} (column {exc.colno})")
    except RecursionError:
        return RefusedRow(row_number, f"JSON nested more than {MAX_DEPTH} levels deep")
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        return RefusedRow(row_number, f"invalid JSON: {str(exc).split(';')[0]}")
    return parse_row(obj, row_number, data_dir)


def jsonl_lines(path: str | Path) -> Iterator[tuple[int, int, bytes]]:
    """``(row number, byte offset, line)`` of each non-blank line of a JSONL file, read one line at a time.

    Blank lines (only whitespace, maybe after a byte order mark) are skipped but still counted, so row numbers are
    line numbers. `DataError` at once when there is no such file.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such data file")
    return _lines(path)


def _lines(path: Path) -> Iterator[tuple[int, int, bytes]]:
    with path.open("rb") as f:
        offset = 0
        for row_number, line in enumerate(f, start=1):
            start, offset = offset, offset + len(line)
            if line.removeprefix(_BOM).strip():
                yield row_number, start, line


def read_rows(path: str | Path) -> Iterator[RowResult]:
    """Stream a JSONL file: one parsed row or `RefusedRow` per non-blank line, in order (see `jsonl_lines`).

    Memory stays flat however large the file is, and a consumer that stops early stops the reading.
    """
    lines = jsonl_lines(path)
    return (parse_line(line, row_number, Path(path).parent) for row_number, _, line in lines)


def iter_rows(records: Iterable[Any]) -> Iterator[RowResult]:
    """Validate in-memory records (e.g. from a notebook), numbering them from 1 like lines of a file."""
    for row_number, obj in enumerate(records, start=1):
        yield parse_row(obj, row_number)
