"""JupyterLab's HTML sanitizer, as a checker: what an untrusted notebook would strip from a widget's HTML.

Lab opens every papermill output and every notebook reopened from disk untrusted, and passes its HTML outputs
through sanitize-html with the rules in jupyterlab_sanitizer_rules.json (cut from Lab's own bundle by
extract_lab_sanitizer_rules.py): tags outside a list are dropped, attributes outside a per-tag list are dropped
(``id`` is renamed ``data-jupyter-id``), and each inline style declaration is kept only if its property is
listed and its value matches one of that property's regular expressions (``width:7ch`` fails: ``ch`` is not
among the units). `stripped` lists everything of that kind in a fragment, so a test can require that nothing a
widget's layout depends on is lost. The regexes are applied with ``re.search``, as JavaScript's ``test`` does.
"""

from __future__ import annotations

import functools
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

RULES = Path(__file__).resolve().parent / "jupyterlab_sanitizer_rules.json"
# sanitize-html drops these tags together with their content; other disallowed tags keep their text.
_NON_TEXT = {"script", "style", "textarea", "option", "noscript"}


@functools.cache
def rules() -> dict[str, Any]:
    raw = json.loads(RULES.read_text())
    styles = {
        prop: [re.compile(src, re.IGNORECASE) for src in srcs] for prop, srcs in raw["allowedStyles"].items()
    }
    return {
        "tags": set(raw["allowedTags"]),
        "attributes": {tag: set(names) for tag, names in raw["allowedAttributes"].items()},
        "styles": styles,
        "version": raw.get("jupyterlab"),
    }


def style_kept(prop: str, value: str) -> bool:
    """Whether Lab keeps the declaration ``prop: value`` in an inline style."""
    value = re.sub(r"\s*!important\s*$", "", value.strip(), flags=re.IGNORECASE)
    patterns = rules()["styles"].get(prop.strip().lower())
    return bool(patterns) and any(p.search(value) for p in patterns)


def _declarations(style: str) -> list[tuple[str, str]]:
    out = []
    for part in re.split(r";(?=(?:[^\"']|\"[^\"]*\"|'[^']*')*$)", style):
        if not part.strip():
            continue
        prop, sep, value = part.partition(":")
        out.append((prop.strip(), value.strip() if sep else ""))
    return out


class _Checker(HTMLParser):
    def __init__(self, *, allow_ids: bool) -> None:
        super().__init__(convert_charrefs=True)
        self.allow_ids = allow_ids
        self.problems: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        r = rules()
        if tag not in r["tags"]:
            what = "tag and its content" if tag in _NON_TEXT else "tag"
            self.problems.append(f"<{tag}> {what} removed")
            return
        allowed = r["attributes"].get("*", set()) | r["attributes"].get(tag, set())
        for name, value in attrs:
            if name == "id":
                if not self.allow_ids:
                    self.problems.append(f"<{tag} id=…> becomes data-jupyter-id (no #anchor target)")
                continue
            if name not in allowed:
                self.problems.append(f"<{tag}> attribute {name}={value!r} removed")
            elif name == "style":
                for prop, val in _declarations(value or ""):
                    if not style_kept(prop, val):
                        self.problems.append(f"<{tag}> style {prop}:{val} removed")

    handle_startendtag = handle_starttag


def stripped(html: str, *, allow_ids: bool = True) -> list[str]:
    """Everything Lab's sanitizer would remove from ``html``, one line each; empty when nothing is lost.
    ``allow_ids=False`` also reports ``id`` attributes (Lab renames them, so in-page links to them break)."""
    checker = _Checker(allow_ids=allow_ids)
    checker.feed(html)
    checker.close()
    return checker.problems
