"""The package's import graph matches its documented layers (docs/README.md, "Architecture").

Read from the source, not by importing: every `import` and `from ... import` in loops_nb, function-local ones
included (they run too), except those under `if TYPE_CHECKING:`, which never run. Two rules:

- no cycle between the package's top-level parts (`llm`, `rl`, `sft`, `config`, `run`, `local`, `project`, ...);
- the core imports neither the CLI nor the notebook widgets: only the composition roots may.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "loops_nb"
COMPOSITION_ROOTS = {"cli"}
"""Parts that may import the CLI or the widgets: the CLI itself (the widgets import no CLI either)."""
TOP_LAYERS = {"cli", "widgets"}


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Import statements that run: those under `if TYPE_CHECKING:` are left out."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the loops_nb modules it imports when it runs."""
    paths = {module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _runtime_imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join([*base, node.module] if node.module else base)
                else:
                    target = node.module or ""
                candidates = [target, *(f"{target}.{a.name}" for a in node.names)]
            else:
                candidates = [a.name for a in node.names]
            for candidate in candidates:
                if candidate in paths and candidate != name:
                    graph[name].add(candidate)
    return graph


def part(module: str) -> str:
    """`loops_nb.rl.grpo` -> `rl`; `loops_nb` itself -> `loops_nb`."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else pieces[0]


def part_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    parts: dict[str, set[str]] = defaultdict(set)
    for source, targets in graph.items():
        for target in targets:
            if part(source) != part(target):
                parts[part(source)].add(part(target))
    return parts


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that ends where it starts, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_parts_of_the_package_import_each_other_without_a_cycle() -> None:
    cycle = find_cycle(part_graph(import_graph()))
    assert cycle is None, "import cycle between parts of loops_nb: " + " -> ".join(cycle or [])


def test_the_core_imports_neither_the_cli_nor_the_widgets() -> None:
    offenders = sorted(
        f"{source} imports {target}"
        for source, targets in import_graph().items()
        for target in targets
        if part(target) in TOP_LAYERS and part(source) not in COMPOSITION_ROOTS | {part(target)}
    )
    assert not offenders, offenders


def test_a_cycle_and_a_core_module_importing_the_cli_are_caught(tmp_path: Path) -> None:
    """The checks can fail: a made-up package with both faults."""
    fake = tmp_path / "loops_nb"
    (fake / "rl").mkdir(parents=True)
    (fake / "sft").mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "rl" / "__init__.py").write_text("")
    (fake / "sft" / "__init__.py").write_text("")
    (fake / "rl" / "loop.py").write_text("from loops_nb.sft.train import run\n")
    (fake / "sft" / "train.py").write_text(
        "def f():\n    from loops_nb.rl import loop\n    import loops_nb.cli\n"
    )
    (fake / "cli.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import loops_nb.rl.loop\n"
    )
    graph = import_graph(fake)
    assert find_cycle(part_graph(graph)) in (["rl", "sft", "rl"], ["sft", "rl", "sft"])
    assert "loops_nb.cli" in graph["loops_nb.sft.train"]
    assert "loops_nb.rl.loop" not in graph.get("loops_nb.cli", set())  # TYPE_CHECKING imports never run


@pytest.mark.parametrize(
    ("module", "allowed"),
    [
        (
            "loops_nb.rl.grpo",
            {
                "loops_nb",
                "loops_nb.rl",
                "loops_nb.rl.grpo",
                "loops_nb.rl.datums",
                "loops_nb.llm",
                "loops_nb.llm.capture",
            },
        )
    ],
)
def test_importing_grpo_loads_only_what_grpo_needs(module: str, allowed: set[str]) -> None:
    import subprocess
    import sys

    code = f"import sys, {module}; print('\\n'.join(m for m in sys.modules if m.startswith('loops_nb')))"
    loaded = set(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.split()
    )
    assert loaded <= allowed, sorted(loaded - allowed)
