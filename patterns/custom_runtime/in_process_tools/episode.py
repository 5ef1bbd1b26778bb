"""A multi-turn, tool-using Episode: the agent looks up prices and calculates a total.

    uv run loops run patterns/custom_runtime/in_process_tools/train_local.toml

Each turn sends the conversation and `tools=` to `llm().chat`; tool calls in the reply are executed
(`shop_tools.py`: a calculator over a safe arithmetic parser, and a price table) and their results appended
as `tool` messages; the loop ends when the model answers without calling a tool, or after `max_turns`.
The last number of the final answer is scored against the task's expected total. Every turn's sampled
tokens train; the tool results and the prompts between turns are context only (the capture joins the
turns into one sequence because each prompt extends the last). SmolLM2 needs `[model] chat_template =
"chatml-tools"`: its own template ignores tools.
"""

from __future__ import annotations

import re
from typing import Any

from shop_tools import PRICES, TOOLS, run_tool

from loops_nb.episodes import Episode, Evidence, Task
from loops_nb.llm.client import llm

SYSTEM = (
    "You are a shopping assistant. Use lookup_price to find prices and calculator to do arithmetic. "
    "When you know the total, answer with the number only."
)
ORDERS = [
    {"apple": 4, "cherry": 3},
    {"banana": 5, "durian": 1},
    {"elderberry": 2, "apple": 2},
    {"cherry": 2, "banana": 3, "apple": 1},
]
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def order_task(order: dict[str, int]) -> Task:
    items = " and ".join(f"{n} {plural(item) if n > 1 else item}" for item, n in order.items())
    total = sum(PRICES[item] * n for item, n in order.items())
    return Task(
        id="+".join(f"{n}{item}" for item, n in order.items()),
        data={"question": f"How much do {items} cost in total?", "expected": total},
    )


def plural(item: str) -> str:
    return item[:-1] + "ies" if item.endswith("y") else item + "s"


def final_number(text: str) -> float | None:
    numbers = _NUMBER.findall(text.replace(",", ""))
    return float(numbers[-1]) if numbers else None


class ToolShopper(Episode):
    def __init__(self, max_turns: int = 6, orders: list[dict[str, int]] | None = None) -> None:
        super().__init__(max_turns=max_turns)
        self.max_turns = max_turns
        self.orders = orders or ORDERS

    def tasks(self) -> list[Task]:
        return [order_task(o) for o in self.orders]

    async def run(self, task: Task) -> Evidence:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": task.data["question"]},
        ]
        calls = errors = 0
        answer: str | None = None
        for _ in range(self.max_turns):
            reply = await llm().chat(messages, tools=TOOLS)
            messages.append(reply.message)
            if not reply.tool_calls:
                answer = reply.content
                break
            for call in reply.tool_calls:
                result, ok = run_tool(call)
                calls += 1
                errors += not ok
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        expected = float(task.data["expected"])
        got = final_number(answer) if answer is not None else None
        reward = 1.0 if got is not None and abs(got - expected) < 1e-6 else 0.0
        metrics = {
            "tool_calls": float(calls),
            "tool_errors": float(errors),
            "answered": float(answer is not None),
            "expected": expected,
        }
        return Evidence(reward=reward, metrics=metrics, transcript=messages)
