"""loops_nb: a Jupyter-first kit for post-training open LLMs with LoRA on Baseten Loops.

The public entry point is `load()`; everything else is imported from the module that defines it.
"""

from loops_nb.project import Project, load

__all__ = ["Project", "load"]
__version__ = "0.1.0"
