"""SFT training: schedule, token batching, the held-out split, check, a tiny run through the embedded Loops, and
the base-vs-adapter comparison.

The run tests train the random tiny model (tests/tiny_models.py) on a few repeated rows: enough for the held-out
loss to fall in ~10 steps of milliseconds each.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
from helpers import read_jsonl
from hypothesis import given, settings
from hypothesis import strategies as st
from sft_fixtures import write_jsonl
from tiny_models import build_tiny_chat_model

from loops_nb import load
from loops_nb.compute import LoopsConnection
from loops_nb.errors import DataError, UserError
from loops_nb.sft import learning_rate, score_reply
from loops_nb.sft.batching import BatchPlan, ExampleIndex, is_held_out, pack
from loops_nb.sft.compare import COLUMNS, compare, normalise_text
from loops_nb.sft.data import Message, jsonl_lines, parse_line
from loops_nb.sft.targets import chat_targets

# -- learning-rate schedule ------------------------------------------------------------------------------------


def test_constant_schedule_warms_up_then_holds():
    lrs = [learning_rate(s, total_steps=6, peak=1.0, schedule="constant", warmup_steps=2) for s in range(6)]
    assert lrs == [0.5, 1.0, 1.0, 1.0, 1.0, 1.0]


def test_linear_schedule_decays_towards_zero_without_reaching_it():
    lrs = [learning_rate(s, total_steps=5, peak=1.0, schedule="linear") for s in range(5)]
    assert lrs == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2])


def test_cosine_schedule_after_warmup():
    lrs = [learning_rate(s, total_steps=6, peak=2.0, schedule="cosine", warmup_steps=2) for s in range(6)]
    assert lrs[:3] == pytest.approx([1.0, 2.0, 2.0])
    assert lrs[3] == pytest.approx(2.0 * 0.5 * (1 + math.cos(math.pi / 4)))
    assert lrs[4] == pytest.approx(1.0)
    assert lrs == sorted(lrs[:3]) + sorted(lrs[3:], reverse=True)
    assert 0 < lrs[-1] < lrs[-2]


def test_warmup_longer_than_the_run_only_warms_up():
    lrs = [learning_rate(s, total_steps=3, peak=1.0, schedule="linear", warmup_steps=4) for s in range(3)]
    assert lrs == pytest.approx([0.25, 0.5, 0.75])


# -- token batching --------------------------------------------------------------------------------------------


@given(
    st.lists(st.integers(1, 300), min_size=0, max_size=60),
    st.integers(16, 400),
    st.randoms(use_true_random=False),
)
@settings(max_examples=200)
def test_pack_never_exceeds_the_budget_and_keeps_the_order(sizes, budget, rng):
    order = list(range(len(sizes)))
    rng.shuffle(order)
    bounds = pack(order, sizes, budget)
    batches = [order[a:b] for a, b in itertools.pairwise(bounds)]
    assert [i for b in batches for i in b] == order
    for batch in batches:
        assert batch
        assert sum(sizes[i] for i in batch) <= budget or len(batch) == 1
    # Greedy: a batch closes only when the next example would not fit.
    for batch, nxt in itertools.pairwise(batches):
        assert sum(sizes[i] for i in batch) + sizes[nxt[0]] > budget


def _rows(n: int) -> list[dict]:
    return [
        {
            "messages": [
                {"role": "user", "content": f"Question number {i}: " + "tell me more. " * (i % 5)},
                {"role": "assistant", "content": f"Answer {i}."},
            ]
        }
        for i in range(n)
    ]


@pytest.fixture
def indexed(tmp_path, smollm2):
    path = write_jsonl(tmp_path / "train.jsonl", _rows(40))
    renderer = chat_targets(smollm2)
    index = ExampleIndex(path)
    for row_number, start, line in jsonl_lines(path):
        index.add(start, renderer.render(parse_line(line, row_number)))
    return index, renderer


def test_every_example_trains_once_per_epoch_within_the_budget(indexed):
    index, renderer = indexed
    plan = BatchPlan(index, batch_tokens=200, epochs=3, seed=7)
    assert plan.total_steps == sum(plan.steps_per_epoch)
    seen: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for batch in plan.batches():
        tokens = sum(index.tokens[i] for i in batch.indices)
        assert tokens <= 200 or len(batch.indices) == 1
        seen[batch.epoch] += batch.indices
    for epoch, indices in seen.items():
        assert sorted(indices) == list(range(len(index))), epoch
    assert seen[0] != seen[1], "each epoch is shuffled afresh"
    # The batch's examples are rebuilt from the file exactly as the index recorded them.
    examples = index.load(plan.batch(3).indices, renderer)
    assert [e.n_tokens for e in examples] == [index.tokens[i] for i in plan.batch(3).indices]


def test_the_plan_is_a_pure_function_of_data_and_config(indexed):
    index, _ = indexed
    a = BatchPlan(index, batch_tokens=200, epochs=2, seed=7)
    b = BatchPlan(index, batch_tokens=200, epochs=2, seed=7)
    assert [a.batch_id(s) for s in range(a.total_steps)] == [b.batch_id(s) for s in range(b.total_steps)]
    c = BatchPlan(index, batch_tokens=200, epochs=2, seed=8)
    assert [a.batch_id(s) for s in range(3)] != [c.batch_id(s) for s in range(3)]
    capped = BatchPlan(index, batch_tokens=200, epochs=2, seed=7, max_steps=4)
    assert capped.total_steps == 4
    assert [capped.batch_id(s) for s in range(4)] == [a.batch_id(s) for s in range(4)]


def test_the_held_out_split_is_stable_and_near_its_fraction():
    chosen = {r for r in range(1, 5001) if is_held_out(r, seed=3, fraction=0.1)}
    assert 400 < len(chosen) < 600
    # Streaming and stable: the decision for a row never depends on the others or on how many there are.
    assert chosen == {r for r in range(1, 5001) if is_held_out(r, 3, 0.1)}
    assert {r for r in range(1, 1001) if is_held_out(r, 3, 0.1)} == {r for r in chosen if r <= 1000}
    assert chosen != {r for r in range(1, 5001) if is_held_out(r, 4, 0.1)}
    assert not any(is_held_out(r, 3, 0.0) for r in range(1, 100))


# -- scoring ---------------------------------------------------------------------------------------------------


def test_scoring_tool_calls_direct_answers_and_text():
    call = Message.model_validate(
        {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                              "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    )  # fmt: skip
    good = '<tool_call>\n{"name": "get_weather", "arguments": {"city": " paris"}}\n</tool_call>'
    assert score_reply(good, call, has_tools=True)[:2] == ("tool_call", 1.0)
    wrong = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    assert score_reply(wrong, call, has_tools=True)[1] == 0.0
    assert score_reply("It is sunny.", call, has_tools=True)[1] == 0.0
    answer = Message(role="assistant", content="The capital of Japan is Tokyo.")
    assert score_reply("the capital of japan is tokyo", answer, has_tools=True) == ("direct_answer", 1.0, 1.0)
    assert score_reply(good, answer, has_tools=True)[1] == 0.0
    assert score_reply("Tokyo!", answer, has_tools=False) == ("text", 0.0, 0.0)
    assert normalise_text("<think>hmm</think>\n  The  Answer. ") == "the answer"


def test_tool_markup_that_does_not_parse_as_a_call_scores_as_neither_answer_nor_call():
    answer = Message(role="assistant", content="I can only look up the weather.")
    hallucinated = 'I can only look up the weather.\n<tool_response>\n{"sky": "sunny"}\n</tool_response>'
    assert score_reply(hallucinated, answer, has_tools=True) == ("direct_answer", 0.0, 0.0)
    assert score_reply("Sure.</tool_call>", answer, has_tools=True)[1] == 0.0
    call = Message.model_validate(
        {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                              "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    )  # fmt: skip
    good = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert score_reply(good, call, has_tools=True)[1] == 1.0
    assert (
        score_reply(good + '\n<tool_response>{"sky": "sunny"}</tool_response>', call, has_tools=True)[1]
        == 0.0
    )
    assert score_reply("the weather in paris", answer, has_tools=True)[1] == 1.0


# -- check and training through the embedded Loops -------------------------------------------------------------

PAIRS = [
    ("what is the capital of france ?", "paris is the capital of france ."),
    ("name a game .", "chess is a game ."),
    ("what game is hidden ?", "the hidden game is monopoly ."),
    ("who are you ?", "I am the assistant ."),
]
BAD_ROWS = [
    "not json",
    json.dumps({"messages": [{"role": "user", "content": "name a game ."}]}),
    json.dumps({"messages": [{"role": "robot", "content": "x"}, {"role": "assistant", "content": "y"}]}),
]


def write_project(folder: Path, model: Path, *, train: list, **training: object) -> Path:
    write_jsonl(folder / "train.jsonl", train)
    settings = {"learning_rate": 2e-2, "batch_tokens": 96, "max_steps": 10, "eval_every": 5, "save_every": 5}
    settings.update(training)
    lines = "\n".join(f"{k} = {json.dumps(v)}" for k, v in settings.items())
    (folder / "sft.toml").write_text(
        f'recipe = "sft"\n[model]\nbase_model = "{model}"\nlora_rank = 8\n'
        f'[compute]\nscope = "local"\n[compute.local]\ndevice = "cpu"\n'
        f'[data]\ntrain = "train.jsonl"\neval_fraction = 0.25\n[training]\n{lines}\n'
        f'[output]\noutput_dir = "{folder / "runs"}"\nrun_name = "tiny"\n'
    )
    return folder / "sft.toml"


def chat(q: str, a: str) -> dict:
    return {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny-sft-model"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model):
    folder = tmp_path_factory.mktemp("sft-run")
    rows = [chat(*PAIRS[i % len(PAIRS)]) for i in range(48)]
    config = write_project(folder, tiny_model, train=rows[:10] + BAD_ROWS + rows[10:])
    project = load(config)
    report = project.check_sync()
    events = EventLog()
    outcome = project.train_sync(observers=[events])
    return project, report, outcome, events


class EventLog:
    """Every observer event of the run, in order (what a live panel is sent), as its line."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []

    def __getattr__(self, name: str):
        if not name.startswith("on_"):
            raise AttributeError(name)
        return lambda event: self.events.append((name, event.to_json()))


def test_the_held_out_loss_before_training_reaches_observers_at_step_0(trained):
    _, _, outcome, log = trained
    names = [name for name, _ in log.events]
    assert names[0] == "on_start" and names[-1] == "on_end"
    evals = [payload for name, payload in log.events if name == "on_eval"]
    assert (
        evals and evals[0]["step"] == 0 and evals[0]["eval/loss"] == pytest.approx(outcome.eval_loss_before)
    )
    # It comes before the first step's record: the panel shows it while step 1 trains.
    assert names.index("on_eval") < names.index("on_step")
    steps = [payload for name, payload in log.events if name == "on_step"]
    assert [s["step"] for s in steps] == list(range(outcome.steps))
    assert all("memory/rss_gb" in s for s in steps)


def test_check_reports_bad_rows_and_the_plan(trained):
    _, report, _, _ = trained
    assert report.ok
    text = "\n".join(report.describe())
    assert "refused: 3" in text and "row 11: invalid JSON" in text
    assert "row 12: messages: no assistant turn" in text and "unknown role 'robot'" in text
    assert "held-out: 25% of the training rows" in text
    assert f"-> {report.total_steps} steps" in text
    assert (
        "template: chat_template on a sample tool conversation: 2 model calls, 0 sequence break(s) per "
        in text
    )
    assert report.describe()[-1] == "check: ok"


def test_training_lowers_the_held_out_loss_and_writes_the_run(trained):
    _project, report, outcome, _ = trained
    run = Path(outcome.run_dir)
    steps = read_jsonl(run / "steps.jsonl")
    assert [s["step"] for s in steps] == list(range(report.total_steps)) == list(range(outcome.steps))
    assert outcome.status == "completed" and outcome.sampler_path
    for key in (
        "epoch",
        "loss",
        "learning_rate",
        "tokens/trained",
        "tokens/total",
        "examples",
        "batch",
        "memory/rss_gb",
        "memory/peak_gb",
        "time",
    ):
        assert key in steps[0], key
    assert all(0.1 < s["memory/rss_gb"] < 20 for s in steps), "the process tree's resident memory, in GB"
    assert all(s["tokens/total"] <= 96 or s["examples"] == 1 for s in steps)
    assert "eval/loss" in steps[-1] and "eval/loss" in steps[4]
    assert outcome.eval_loss < outcome.eval_loss_before - 0.05, (outcome.eval_loss_before, outcome.eval_loss)
    run_json = json.loads((run / "run.json").read_text())
    held = [r for r in range(1, 52) if is_held_out(r, 0, 0.25)]
    assert run_json["recipe"] == "sft" and run_json["data"]["held_out_rows"] == len(held)
    assert run_json["data"]["rows_refused"] == len({11, 12, 13} - set(held))
    assert run_json["data"]["examples"] == 48 - len(set(held) - {11, 12, 13})
    # The renderer resolved when the run started: what the policy sampler and a resume use for it later.
    assert run_json["renderer"]["name"] == "chat_template" and run_json["renderer"]["setting"] == "auto"
    checkpoints = read_jsonl(run / "checkpoints.jsonl")
    assert [c["step"] for c in checkpoints] == [5, outcome.steps]
    assert any("held-out loss:" in line for line in outcome.describe())


def test_a_finished_run_rerun_returns_at_once_without_a_loops_client(trained, monkeypatch, caplog):
    project, _, outcome, _ = trained
    run = Path(outcome.run_dir)
    run_json = (run / "run.json").read_text()

    async def no_client(*args, **kwargs):
        raise AssertionError("a finished run needs no Loops connection")

    monkeypatch.setattr(LoopsConnection, "open", no_client)
    again = project.train_sync(observers=[])
    assert again.status == "completed"
    assert again.steps == outcome.steps and again.start_step == outcome.steps
    assert (again.checkpoint, again.sampler_path) == (outcome.checkpoint, outcome.sampler_path)
    assert again.eval_loss == pytest.approx(outcome.eval_loss)
    assert again.eval_loss_before == pytest.approx(outcome.eval_loss_before)
    lines = (run / "steps.jsonl").read_text().splitlines()
    assert len(lines) == outcome.steps
    assert (run / "run.json").read_text() == run_json, "run.json (and its run_id) is untouched"
    said = f"{run} is already complete: {outcome.steps} steps"
    assert said in caplog.text and said in (run / "run.log").read_text()


async def test_run_id_names_the_first_client_and_later_ones_are_listed_beside_it(tmp_path, tiny_model):
    rows = [chat(*PAIRS[i % len(PAIRS)]) for i in range(12)]
    config = write_project(tmp_path, tiny_model, train=rows, max_steps=2, save_every=0, eval_every=0)
    await load(config).train(observers=[])
    run = tmp_path / "runs" / "tiny"
    first = json.loads((run / "run.json").read_text())
    assert first["run_ids"] == [first["run_id"]]
    outcome = await load(config, overrides={"training.max_steps": 3}).train(observers=[])
    assert (outcome.start_step, outcome.steps) == (2, 3)
    later = json.loads((run / "run.json").read_text())
    assert later["run_id"] == first["run_id"], "run_id is never overwritten"
    assert later["run_ids"][0] == first["run_id"] and len(set(later["run_ids"])) == 2
    assert later["started"] == first["started"]


async def test_compare_returns_a_table_of_base_and_adapter_replies(trained):
    project, _, outcome, _ = trained
    comparison = await compare(project, outcome, rows=3, max_tokens=4)
    table = comparison.table
    assert list(table.columns) == list(COLUMNS)
    assert len(table) == 3 and set(table["kind"]) == {"text"}
    assert set(table["base_score"]) <= {0.0, 1.0} and set(table["adapter_score"]) <= {0.0, 1.0}
    assert table["reference"].iloc[0] in {a for _, a in PAIRS}
    # The adapter is served, not the base model again (an untrained LoRA would answer exactly like the base).
    assert (table["base_reply"] != table["adapter_reply"]).any(), table[["base_reply", "adapter_reply"]]
    text = "\n".join(comparison.describe())
    assert "accuracy: base" in text and "scoring:" in text
    # Without the run, compare takes the config's (output.run_name): the same adapter, the same greedy replies.
    assert (await compare(project, rows=3, max_tokens=4)).table.equals(table)


async def test_check_says_how_to_make_missing_data(tmp_path, tiny_model):
    config = write_project(tmp_path, tiny_model, train=[])
    (tmp_path / "train.jsonl").unlink()
    (tmp_path / "prepare.py").write_text("# makes train.jsonl\n")
    report = await load(config).check()
    assert not report.ok
    assert "run `python" in report.problems[0] and "prepare.py" in report.problems[0]
    assert report.describe()[-1] == "check: 1 problem(s)"


async def test_check_fails_when_no_row_trains(tmp_path, tiny_model):
    config = write_project(tmp_path, tiny_model, train=BAD_ROWS)
    report = await load(config).check()
    assert not report.ok and "trains" in report.problems[0]
    with pytest.raises(DataError, match="no row of"):  # refused before any trainer starts
        await load(config).train(observers=[])


async def test_a_run_killed_before_its_first_checkpoint_starts_over_and_a_changed_plan_is_refused(
    tmp_path, tiny_model
):
    rows = [chat(*PAIRS[i % len(PAIRS)]) for i in range(24)]
    config = write_project(tmp_path, tiny_model, train=rows, max_steps=3, save_every=0, eval_every=0)
    run = tmp_path / "runs" / "tiny"
    run.mkdir(parents=True)
    # What a process killed after its first step leaves: a step record and evaluations, no checkpoint.
    (run / "steps.jsonl").write_text(json.dumps({"step": 0, "batch": "left-over"}) + "\n")
    (run / "evals.jsonl").write_text(json.dumps({"step": 0, "eval/loss": 9.0}) + "\n")
    outcome = await load(config).train(observers=[])
    steps = read_jsonl(run / "steps.jsonl")
    assert [s["step"] for s in steps] == [0, 1, 2] and steps[0]["batch"] != "left-over"
    assert outcome.eval_loss_before != 9.0
    with pytest.raises(UserError, match=r"Use a new output\.run_name"):
        await load(config, overrides={"training.batch_tokens": 64}).train(observers=[])
