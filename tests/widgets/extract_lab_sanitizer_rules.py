"""Regenerate jupyterlab_sanitizer_rules.json from the JupyterLab installed in this venv (needs ``node``).

JupyterLab sanitizes every HTML output of an untrusted notebook (a papermill output, a notebook reopened from
disk) with sanitize-html and the options built in ``@jupyterlab/apputils``' ``Sanitizer``: allowed tags, allowed
attributes per tag, and one regular expression per allowed style property. This script cuts that class and
its options out of Lab's built bundle, evaluates them with node and writes the tags, attributes and the
regexes' sources as JSON, so that `lab_sanitizer` can apply the same rules in a unit test without a browser.

    .venv/bin/python tests/widgets/extract_lab_sanitizer_rules.py   # after upgrading jupyterlab
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "jupyterlab_sanitizer_rules.json"


def bundle() -> Path:
    static = Path(sys.prefix) / "share" / "jupyter" / "lab" / "static"
    for path in sorted(static.glob("*.js")):
        text = path.read_text(errors="replace")
        if "allowedStyles:{" in text and "{static reg(e){return RegExp(" in text:
            return path
    raise SystemExit(f"no JupyterLab bundle with the sanitizer's options under {static}")


def main() -> None:
    import jupyterlab

    text = bundle().read_text(errors="replace")
    options_at = text.index("allowedTags:[")
    # The regex-holding class is the one whose static reg() anchors a pattern, defined just before the options.
    class_at = text.rindex("{static reg(e){return RegExp(", 0, options_at)
    class_at = text.rindex("class ", 0, class_at)
    name = text[class_at + 6 : text.index("{", class_at)]
    class_end = text.index("class ", class_at + 6)
    options_end = text.index("transformTags:", options_at)
    script = (
        text[class_at:class_end]
        + "\nconst self={_allowNamedProperties:false,_allowCommandLinker:true};\n"
        + "const o=({"
        + text[options_at:options_end].rstrip(",").replace("this.", "self.")
        + "});\n"
        + "const styles={};for(const [k,v] of Object.entries(o.allowedStyles['*'])) styles[k]=v.map(r=>r.source);\n"
        + "console.log(JSON.stringify({allowedTags:o.allowedTags,allowedAttributes:o.allowedAttributes,"
        + "allowedStyles:styles}));"
    )
    assert name, "the regex class has no name"
    with tempfile.NamedTemporaryFile("w", suffix=".js", delete=False) as f:
        f.write(script)
    rules = json.loads(subprocess.run(["node", f.name], check=True, capture_output=True, text=True).stdout)
    rules = {"jupyterlab": jupyterlab.__version__, **rules}
    OUT.write_text(json.dumps(rules, indent=1, sort_keys=True) + "\n")
    print(f"{OUT}: {len(rules['allowedStyles'])} style properties, JupyterLab {jupyterlab.__version__}")


if __name__ == "__main__":
    main()
