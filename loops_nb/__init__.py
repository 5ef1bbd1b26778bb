"""loops_nb: a Jupyter-first kit for post-training open LLMs with LoRA on Baseten Loops.

The public entry point is `load()`; everything else is imported from the module that defines it. `load` and
`Project` are loaded on first use, so importing one module of the package (`loops_nb.rl.grpo`) imports only
what that module needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loops_nb.project import Project, load

__all__ = ["Project", "load"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in __all__:
        from loops_nb import project

        return getattr(project, name)
    raise AttributeError(f"module 'loops_nb' has no attribute {name!r}")
