"""Drive JupyterLab in headless Chromium: start a loopback server, run every cell, and check what rendered.

Used by the browser tests (``tests/browser/``, described in tests/README.md). The server is isolated from the
user's Jupyter settings; Run All goes through the Run menu after the kernel is idle (accepting Lab 4's occasional
"Select Kernel" dialog, without which Run All does nothing). Nothing here downloads a browser: playwright drives
the system Chromium through ``executable_path``.

`check_outputs` is the assertion helper: it reads facts off the rendered output areas (never the cell sources,
which contain the same words) and returns a list of problems, empty when the page is healthy. The negative
controls in test_jupyterlab.py run it against broken pages and require it to complain.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = os.environ.get("LOOPS_NB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]

# Text that must never be in a rendered output area: a widget that did not load, a renderer that failed, a
# widget's Python repr shown instead of its view (what Lab falls back to without the widget manager), a
# Python traceback.
BAD_OUTPUT_TEXT = (
    "Loading widget",
    "Error displaying widget",
    "javascript error",
    "Failed to load",
    "Model not found",
    "Button(",
    "LiveFigure(",
    "Traceback (most recent call last)",
    "Cell In[",
)


# -- the server ---------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LabServer:
    """A JupyterLab server on loopback serving ``root``, isolated from the user's Jupyter config."""

    root: Path
    home: Path
    env: dict[str, str]
    port: int = field(default_factory=free_port)
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 90.0) -> LabServer:
        env = dict(self.env)
        for var, sub in (
            ("JUPYTER_CONFIG_DIR", "config"),
            ("JUPYTER_DATA_DIR", "data"),
            ("JUPYTER_RUNTIME_DIR", "runtime"),
            ("JUPYTERLAB_SETTINGS_DIR", "lab-settings"),
            ("JUPYTERLAB_WORKSPACES_DIR", "lab-workspaces"),
        ):
            env[var] = str(self.home / sub)
            (self.home / sub).mkdir(parents=True, exist_ok=True)
        env["JUPYTER_PLATFORM_DIRS"] = "1"
        _write_json(  # the announcements toast would cover the screenshots
            self.home / "config" / "labconfig" / "page_config.json",
            {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}},
        )
        # Every cell in the DOM, laid out: Lab's default windowing defers off-screen cells.
        _write_json(
            self.home / "lab-settings" / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings",
            {"windowingMode": "none"},
        )
        self.log_path = self.home / "jupyterlab.log"
        cmd = [
            sys.executable,  # the kernel then runs this interpreter too (jupyter_client substitutes it)
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ServerApp.open_browser=False",
            "--ip=127.0.0.1",
            f"--port={self.port}",
            "--ServerApp.port_retries=0",
            "--ServerApp.allow_root=True",
            f"--ServerApp.root_dir={self.root}",
            f"--IdentityProvider.token={self.token}",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.news_url=None",
        ]
        log = self.log_path.open("wb")
        # Its own session: teardown ends the server and the kernels it started, and nothing else.
        self.proc = subprocess.Popen(
            cmd, cwd=self.root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/api/status?token={self.token}", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"jupyter lab not up after {timeout_s:.0f}s:\n{self.log_tail()}")

    def api(self, method: str, path: str) -> Any:
        req = urllib.request.Request(
            f"{self.url}{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            body = r.read()
        return json.loads(body) if body else None

    def shutdown_kernels(self) -> None:
        """Stop every kernel (a finished test's kernel would otherwise hold CPU and memory)."""
        for kernel in self.api("GET", "/api/kernels") or []:
            with contextlib.suppress(urllib.error.URLError):
                self.api("DELETE", f"/api/kernels/{kernel['id']}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = self.proc.pid  # start_new_session: the server leads its own process group
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):  # kernels left behind in the group
            os.killpg(pgid, signal.SIGKILL)

    def log_tail(self, n: int = 4000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-n:]


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))


# -- the page -----------------------------------------------------------------------------------------------


@dataclass
class Console:
    """Console errors and uncaught page errors, collected from the moment a page opens."""

    errors: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def attach(self, page: Any) -> Console:
        page.on("console", self._on_console)
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        return self

    def _on_console(self, msg: Any) -> None:
        line = f"{msg.type}: {msg.text}"
        self.lines.append(line)
        if msg.type == "error":
            self.errors.append(line)


def open_notebook(page: Any, server: LabServer, name: str) -> None:
    """Open ``name`` in a fresh workspace and wait until its kernel is idle."""
    page.goto(f"{server.url}/lab/tree/{name}?token={server.token}&reset")
    page.wait_for_selector(".jp-NotebookPanel", timeout=90_000)
    # Lab 4 sometimes asks to select a kernel even when one is starting; Run All would then do nothing.
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    with contextlib.suppress(PlaywrightTimeout):  # no dialog: the usual case
        page.locator(".jp-Dialog .jp-mod-accept").click(timeout=5_000)
    page.wait_for_selector(".jp-KernelName:has-text('Python 3')", timeout=90_000)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000)


_PROMPTS_JS = (
    "() => [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(e => e.textContent.trim())"
)


def run_all(
    page: Any, *, timeout_s: float, during: Callable[[Any], None] | None = None, poll_s: float = 0.25
) -> list[str]:
    """Run All from the Run menu; wait until no cell is queued or running. ``during(page)`` is called at every
    poll while cells run (to look at what is only on screen mid-run, such as a Stop button). Returns the
    input prompts (``[3]:``; ``[ ]:`` for a cell that never ran, after an error)."""
    page.locator(".lm-MenuBar-itemLabel:text-is('Run')").click()
    page.locator("li.lm-Menu-item[data-command='runmenu:run-all']").click()
    deadline = time.monotonic() + timeout_s
    while True:
        prompts = page.evaluate(_PROMPTS_JS)
        if during is not None:
            during(page)
        ran = any(re.search(r"\[\d+\]", p) for p in prompts)
        if ran and not any("*" in p for p in prompts):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"cells still running after {timeout_s:.0f}s: {prompts}")
        time.sleep(poll_s)
    page.wait_for_timeout(1_000)  # the last display update's paint
    return prompts


# -- what rendered ------------------------------------------------------------------------------------------

_FACTS_JS = r"""
() => {
  const areas = [...document.querySelectorAll('.jp-Cell .jp-OutputArea')];
  const inAreas = sel => areas.flatMap(a => [...a.querySelectorAll(sel)]);
  const drawn = e => { const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
  const dots = re => inAreas('[title]').filter(e => re.test(e.getAttribute('title')) && drawn(e)).length;
  const tokens = {trained: 0, masked: 0, negative: 0, unstyled: 0};
  for (const s of inAreas('span[title]')) {
    const m = /^#\d+ id=\d+ weight=(\S+)/.exec(s.getAttribute('title'));
    if (!m || !drawn(s)) continue;
    const w = parseFloat(m[1]);
    const bg = getComputedStyle(s).backgroundColor;
    if (w > 0 && bg.startsWith('rgba(46, 160, 67')) tokens.trained++;
    else if (w < 0 && bg.startsWith('rgba(218, 54, 51')) tokens.negative++;
    else if (w === 0 && (bg === 'rgba(0, 0, 0, 0)' || bg === 'transparent')) tokens.masked++;
    else tokens.unstyled++;
  }
  return {
    text: areas.map(a => a.textContent).join('\n'),
    reward_points: dots(/^step \d+: reward\/mean /),
    loss_points: dots(/^step \d+: train loss /),
    plotly_points: inAreas('.js-plotly-plot .scatterlayer .point').filter(drawn).length,
    tokens,
    widget_buttons: inAreas('button.jupyter-button').filter(drawn).map(b => b.textContent.trim()),
    widget_views: inAreas('.jupyter-widgets').length,
  };
}
"""


def page_facts(page: Any) -> dict[str, Any]:
    return page.evaluate(_FACTS_JS)


@dataclass
class Expect:
    """What a healthy page shows once every cell has run."""

    texts: tuple[str, ...] = ()  # in the output areas' text
    reward_points: int = (
        0  # at least this many reward points in a RunChart's table (its HTML without JavaScript)
    )
    loss_points: int = 0  # likewise for the train loss
    plotly_points: int = 0  # at least this many points drawn by plotly (a chart's plotly JSON or live figure)
    target_preview: bool = False  # TargetPreview tokens: trained (green) and masked (plain) both drawn
    widget_buttons: tuple[str, ...] = ()  # ipywidgets buttons that must have rendered (now or mid-run)


def check_outputs(
    facts: dict[str, Any],
    console: Console,
    prompts: list[str],
    expect: Expect,
    *,
    seen_buttons: Iterable[str] = (),
) -> list[str]:
    """Every way the rendered notebook falls short of ``expect``; empty when it is healthy."""
    problems = []
    idle = [p for p in prompts if not re.search(r"\[\d+\]", p)]
    if idle:
        problems.append(f"{len(idle)} of {len(prompts)} code cells did not run: {prompts}")
    text = facts["text"]
    for bad in BAD_OUTPUT_TEXT:
        if bad.lower() in text.lower():
            problems.append(f"output shows {bad!r}: …{_around(text, bad)}…")
    for want in expect.texts:
        if want not in text:
            problems.append(f"output lacks {want!r}")
    if facts["reward_points"] < expect.reward_points:
        problems.append(
            f"reward curve drew {facts['reward_points']} points, expected ≥ {expect.reward_points}"
        )
    if facts["loss_points"] < expect.loss_points:
        problems.append(f"loss curve drew {facts['loss_points']} points, expected ≥ {expect.loss_points}")
    if facts["plotly_points"] < expect.plotly_points:
        problems.append(f"plotly drew {facts['plotly_points']} points, expected ≥ {expect.plotly_points}")
    if expect.target_preview:
        tokens = facts["tokens"]
        if not tokens["trained"] or not tokens["masked"]:
            problems.append(f"target preview lacks trained or masked tokens: {tokens}")
        if tokens["unstyled"]:
            problems.append(f"target preview has tokens without their weight's colour: {tokens}")
    buttons = set(facts["widget_buttons"]) | set(seen_buttons)
    for label in expect.widget_buttons:
        if label not in buttons:
            problems.append(f"widget button {label!r} never rendered (rendered: {sorted(buttons)})")
    if console.errors:
        problems.append(f"{len(console.errors)} console errors: {console.errors[:5]}")
    return problems


def _around(text: str, needle: str, width: int = 80) -> str:
    i = text.lower().find(needle.lower())
    return text[max(0, i - width) : i + len(needle) + width].replace("\n", " ")


def save_artifacts(page: Any, artifacts: Path, name: str, facts: dict[str, Any], console: Console) -> None:
    """A screenshot of the page and of the outputs the checks look at, the output text and the console."""
    artifacts.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(artifacts / f"{name}.png"))
    for part, selector in (
        ("curve", ".jp-OutputArea-output:has([title^='step '])"),
        ("preview", ".jp-OutputArea-output:has(span[title*=' weight='])"),
        ("plotly", ".jp-OutputArea-child:has(.js-plotly-plot)"),
        ("panel", ".jp-OutputArea:has(.js-plotly-plot)"),  # a run cell's outputs: the panel, then its chart
    ):
        found = page.locator(selector)
        if found.count():
            try:
                _element_shot(page, found.first, artifacts / f"{name}-{part}.png")
            except Exception as exc:  # a screenshot is evidence, never the reason a test fails
                (artifacts / f"{name}-{part}.error.txt").write_text(str(exc))
    (artifacts / f"{name}-outputs.txt").write_text(facts["text"])
    summary = {k: v for k, v in facts.items() if k != "text"}
    (artifacts / f"{name}-facts.json").write_text(json.dumps(summary, indent=2))
    (artifacts / f"{name}-console.txt").write_text("\n".join(console.lines))


def snapshot(page: Any, selector: str, path: Path) -> bool:
    """`_element_shot` of the first element matching ``selector``, if there is one (never raises)."""
    try:
        found = page.locator(selector)
        if not found.count():
            return False
        _element_shot(page, found.first, path)
        return path.is_file()
    except Exception:  # a screenshot is evidence, never the reason a test fails
        return False


DOCS_IMAGES = "LOOPS_NB_DOCS_IMAGES"


def publish_docs_images(artifacts: Path, names: dict[str, str]) -> None:
    """Copy screenshots (artifact name -> docs name) to ``$LOOPS_NB_DOCS_IMAGES`` when it is set: how
    docs/images is refreshed (``LOOPS_NB_DOCS_IMAGES=docs/images uv run pytest tests/browser``)."""
    target = os.environ.get(DOCS_IMAGES)
    if not target:
        return
    Path(target).mkdir(parents=True, exist_ok=True)
    for source, name in names.items():
        if (artifacts / source).is_file():
            shutil.copyfile(artifacts / source, Path(target) / name)


def _element_shot(page: Any, element: Any, path: Path) -> None:
    """The element's top, as far as the viewport shows it (Playwright's element screenshot of something
    taller than the viewport pastes Lab's toolbars over it)."""
    element.evaluate("e => e.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(200)
    box = element.bounding_box()
    view = page.viewport_size
    if not box or not view:
        return
    top = max(box["y"], 0)
    height = min(box["y"] + box["height"], view["height"]) - top
    if height > 0:
        page.screenshot(
            path=str(path), clip={"x": box["x"], "y": top, "width": box["width"], "height": height}
        )
