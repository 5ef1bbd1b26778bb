"""Count the circles: an RL task on images, for vision-language models (the `vision` extra).

Each task draws a few overlapping circles with PIL (seeded, so a task is the same image every time); the
episode asks the model once how many there are, and grades the reply here: 1.0 for the right number,
0.1 for a reply that is one number but the wrong one (so the format is learnt first), 0 otherwise. The
configs evaluate on held-out images, drawn with another seed, that training never sees (`[eval]`).

    uv run loops check examples/counting/train_local.toml   # renders every prompt's image: tokens, image cost
    uv run loops run   examples/counting/train_local.toml   # the tiny random test VLM: runs, cannot learn
    uv run loops run   examples/counting/train.toml         # a real VLM on Baseten serverless Loops
"""

from __future__ import annotations

import random
import re
from typing import Any

from loops_nb.episodes import Episode, Task
from loops_nb.llm.client import llm

PROMPT = "How many circles are in this image? Reply with one number only."
COLOURS = ["red", "blue", "green", "orange", "purple", "black", "teal", "brown"]


def draw_circles(count: int, seed: int, size: int = 224) -> Any:
    """`count` circles of random radius and colour, overlapping freely, on a white square (RGB PIL image)."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    for _ in range(count):
        r = rng.randint(size // 12, size // 4)
        x, y = rng.randint(r, size - r), rng.randint(r, size - r)
        draw.ellipse((x - r, y - r, x + r, y + r), outline=rng.choice(COLOURS), width=3)
    return image


def grade(reply: str, count: int) -> float:
    numbers = re.findall(r"-?\d+", reply)
    if len(numbers) != 1:
        return 0.0
    return 1.0 if int(numbers[0]) == count else 0.1


class CountCircles(Episode):
    def __init__(self, tasks: int = 32, max_circles: int = 6, seed: int = 0, image_size: int = 224) -> None:
        super().__init__(tasks=tasks, max_circles=max_circles, seed=seed, image_size=image_size)
        rng = random.Random(seed)
        # Another seed draws other images: `[eval] options = {seed = 1}` gives held-out tasks (named apart).
        prefix = "circles-" if seed == 0 else f"circles-s{seed}-"
        self._tasks = [
            Task(
                id=f"{prefix}{i:03d}", data={"count": rng.randint(1, max_circles), "seed": seed * 100_003 + i}
            )
            for i in range(tasks)
        ]
        self.image_size = image_size

    def tasks(self) -> list[Task]:
        return self._tasks

    def prompt_messages(self, task: Task) -> list[dict[str, Any]]:
        """The one prompt of an attempt (also what `loops check` renders)."""
        image = draw_circles(task.data["count"], task.data["seed"], self.image_size)
        return [
            {
                "role": "user",
                "content": [{"type": "image", "image": image}, {"type": "text", "text": PROMPT}],
            }
        ]

    async def run(self, task: Task) -> float:
        reply = await llm().chat(self.prompt_messages(task))
        return grade(reply.content, task.data["count"])
