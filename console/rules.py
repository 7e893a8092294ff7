"""The console's Rules page: every alert of the lab's rule files, and the workbench for one of
them (its expression, its `for:` and its threshold edited in a PromQL editor, then backtested,
then applied).

- **Backtest** runs `runwatch backtest` over a copy of the lab's rules with the edit, with a
  sweep of the edited alert around the edited value, and shows its tables and its plot.
- **Apply** checks a copy of the lab's configuration with the edit as `runwatch reload` checks
  it (`runwatch check --root COPY --edit-of RULES`: promtool check rules and config, amtool, and
  the promtool unit tests that do not pin what the edit changes; runwatch.prom.edits says why).
  If a check fails, it says in one line what failed and what to do next, shows the checks'
  output folded, and writes nothing. Otherwise it keeps
  the file's previous version beside it (`alerts.yml.previous`, which Prometheus does not load),
  swaps the edited file in and runs `runwatch reload`. The swap compares the file's content
  first (runwatch.core.files.replace_if): a save made on disk during the checks is kept, and
  the edit refused.

One writer at a time: a second Apply while one runs is told to wait, and at most MAX_BACKTESTS
backtests run at once; each command the page runs is a process group of its own, ended whole.

The file is edited line by line: only the edited rule's `expr:` (written as a literal block),
its `for:` line and its threshold recording's `expr:` change, and every comment stays. The
result is parsed back and must equal the old file with exactly that edit, or nothing is written.

The editor is CodeMirror with codemirror-promql (static/vendor/promql-editor.js, `make
console-editor`); its completion reads the lab's metric names through /rules/prometheus/, a
read-only pass-through of a few of Prometheus's metadata endpoints, so the page's CSP stays
'self'. Nothing here decides what an alert does: promtool checks, Prometheus evaluates.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from subprocess import PIPE
from typing import Any

import requests
import yaml
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from runwatch.console.sources import UnavailableError
from runwatch.core.bounded import BoundedReadError, copy_folder, load_json_object, load_yaml
from runwatch.core.durations import DurationError, duration_seconds
from runwatch.core.files import replace_if
from runwatch.core.names import RECORDED_INCIDENTS, THRESHOLD
from runwatch.core.paths import Layout

ALERT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
NUMBER = re.compile(r"\d*\.?\d+(?:[eE][-+]?\d+)?")
SEEDS = re.compile(r"\d{1,4}(?:-\d{1,4})?")
STRENGTHS = re.compile(r"\d*\.?\d+-\d*\.?\d+|\d*\.?\d+(?:,\d*\.?\d+)*")
INJECT = re.compile(r"[a-z_]+(?::\d*\.?\d+)?(?:,[a-z_]+(?::\d*\.?\d+)?){0,5}")
RUN_ID = re.compile(r"[^\x00-\x1f\x7f,]{1,200}")  # one run: any id a job names itself, one line, no list
MAX_EDIT_EXPR = 4000  # characters: far more than any rule here, little enough to refuse a paste gone wrong
BACKTEST_TIMEOUT_S = 600  # a cold backtest of 100 seeds is 10 s quiet, a minute on a loaded machine
KEPT_PLOTS = 20
MAX_BACKTESTS = 1  # at a time: each trains its runs on every core (runwatch backtest --workers)
CHECK_TIMEOUT_S = 120  # `runwatch check` of a copy, then `runwatch reload`: promtool's unit tests take seconds
GROUP_END_S = 5.0  # a SIGKILLed process group's members end at once; a zombie awaits its reaper
PROXIED = re.compile(r"labels|label/[A-Za-z_][A-Za-z0-9_]*/values|series|metadata")
# the sweep a Backtest draws around the edited value: below and above it
THRESHOLD_FACTORS = (0.6, 0.8, 0.9, 1.1, 1.25, 1.5)
FOR_STEPS_S = (-10, -5, 5, 10, 20)


class EditError(ValueError):
    """An edit the console cannot make: the message says which field and why."""


@dataclass
class Alert:
    name: str
    file: Path
    group: str
    expr: str
    hold: str  # its for:, "" for none
    severity: str
    runbook: str
    threshold: str | None  # its threshold recording's value when that is vector(N)


def rules_root(console: Any) -> Layout:
    """The configuration the lab runs: its lab.json's root, else the one `runwatch check` finds."""
    state = console.sources.state_dir
    if state is not None and (state / "lab.json").is_file():
        root = load_json_object(state / "lab.json", "the lab's record").get("root")
        if not isinstance(root, str):
            raise BoundedReadError(f"{state / 'lab.json'}: the lab's record names no root; restart the lab")
        return Layout(Path(root))
    return Layout()


def alerts_of(layout: Layout) -> list[Alert]:
    """Every alert of the rule files, in file order, with its threshold when it reads one."""
    out: list[Alert] = []
    for path in layout.rule_files():
        doc = load_yaml(path, "a rule file") or {}  # bounded: a link to /dev/zero, an alias bomb (issue 40)
        if not isinstance(doc, dict):
            raise BoundedReadError(f"{path}: a rule file is not a mapping with `groups:`; see `runwatch check`")
        rules = [(g.get("name", ""), r) for g in doc.get("groups", []) for r in g.get("rules", [])]
        values = {}
        for _, r in rules:
            if r.get("record") == THRESHOLD and (r.get("labels") or {}).get("alertname"):
                m = re.fullmatch(rf"\s*vector\(\s*({NUMBER.pattern})\s*\)\s*", str(r["expr"]))
                values[r["labels"]["alertname"]] = m[1] if m else None
        for group, r in rules:
            if "alert" in r:
                out.append(Alert(
                    r["alert"], path, group, str(r["expr"]).strip(), str(r.get("for", "")),
                    str((r.get("labels") or {}).get("severity", "")),
                    str((r.get("annotations") or {}).get("runbook_url", "")), values.get(r["alert"]),
                ))  # fmt: skip
    return out


# --- editing a rule file, line by line ---


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _block(lines: list[str], start: int) -> int:
    """The end (exclusive) of the list item `- ...` that starts at line `start`."""
    dash = _indent(lines[start])
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > dash):
        end += 1
    while end > start + 1 and not lines[end - 1].strip():  # blank lines after it belong to no one
        end -= 1
    return end


def _key(lines: list[str], start: int, end: int, key: str, indent: int) -> tuple[int, int] | None:
    """[first, last) lines of `key:` at this indent in lines[start:end], its value's lines included."""
    for i in range(start, end):
        if _indent(lines[i]) == indent and re.match(rf"\s*(- )?{re.escape(key)}:", lines[i]):
            j = i + 1
            while j < end and (not lines[j].strip() or _indent(lines[j]) > indent):
                j += 1
            while j > i + 1 and not lines[j - 1].strip():
                j -= 1
            return i, j
    return None


def edit_text(text: str, alert: str, expr: str | None, hold: str | None, threshold: str | None) -> str:
    """The rule file's text with the alert's expr, for: and threshold set (None: left as is; a
    hold of "": no for:). Raises EditError if the result does not parse back to exactly that."""
    lines = text.split("\n")
    starts = [i for i, line in enumerate(lines) if re.fullmatch(rf"\s*- alert:\s*{re.escape(alert)}\s*", line)]
    if len(starts) != 1:
        raise EditError(f"alert: {alert} is not written once as `- alert: {alert}` in the file")
    start = starts[0]
    end, key = _block(lines, start), _indent(lines[start]) + 2
    edits: list[tuple[int, int, list[str]]] = []  # [first, last) lines replaced by these
    found = _key(lines, start, end, "expr", key)
    if found is None:
        raise EditError(f"expr: {alert} has no expr: line the console can find")
    if expr is not None:
        body = textwrap.dedent(expr.replace("\r\n", "\n").replace("\r", "\n")).strip("\n")
        body_lines = [line.rstrip() for line in body.split("\n")]
        edits.append(
            (found[0], found[1], [" " * key + "expr: |-", *(" " * (key + 2) + b if b else "" for b in body_lines)])
        )
    if hold is not None:
        at = _key(lines, start, end, "for", key)
        new = [" " * key + f"for: {hold}"] if hold else []
        edits.append((at[0], at[1], new) if at else (found[1], found[1], new))
    if threshold is not None:
        edits.append(_threshold_edit(lines, alert, threshold))
    for first, last, new in sorted(edits, key=lambda e: -e[0]):  # from the end: earlier lines keep their place
        lines[first:last] = new
    edited = "\n".join(lines)
    _same_but(text, edited, alert, expr, hold, threshold)
    return edited


def _threshold_edit(lines: list[str], alert: str, value: str) -> tuple[int, int, list[str]]:
    for i, line in enumerate(lines):
        if re.fullmatch(rf"\s*- record:\s*{re.escape(THRESHOLD)}\s*", line):
            end, key = _block(lines, i), _indent(line) + 2
            if any(re.fullmatch(rf"\s*alertname:\s*{re.escape(alert)}\s*", x) for x in lines[i:end]):
                at = _key(lines, i, end, "expr", key)
                if at is not None:
                    return at[0], at[1], [" " * key + f"expr: vector({value})"]
    raise EditError(f'threshold: the file records no {THRESHOLD}{{alertname="{alert}"}} to set')


def _same_but(old: str, new: str, alert: str, expr: str | None, hold: str | None, threshold: str | None) -> None:
    """The edited file must parse to the old one with exactly the edit made."""
    try:
        before, after = yaml.safe_load(old), yaml.safe_load(new)
    except yaml.YAMLError as err:
        raise EditError(f"the edit does not parse as YAML: {err}") from None
    for group in before.get("groups", []):
        for rule in group.get("rules", []):
            if rule.get("alert") == alert:
                if expr is not None:
                    rule["expr"] = textwrap.dedent(expr.replace("\r\n", "\n").replace("\r", "\n")).strip("\n")
                    rule["expr"] = "\n".join(line.rstrip() for line in rule["expr"].split("\n"))
                if hold is not None:
                    rule.pop("for", None)
                    if hold:
                        rule["for"] = hold
            if rule.get("record") == THRESHOLD and (rule.get("labels") or {}).get("alertname") == alert:
                if threshold is not None:
                    rule["expr"] = f"vector({threshold})"
    if after != before:
        raise EditError("the console cannot make this edit in place (the file's layout); edit the file itself")


# --- the edit, as the form sends it ---


@dataclass
class Edit:
    alert: Alert
    expr: str | None
    hold: str | None
    threshold: str | None

    @classmethod
    def of(cls, alert: Alert, form: dict[str, str]) -> Edit:
        expr = form.get("expr", "").replace("\r\n", "\n")
        if not expr.strip():
            raise EditError("expr: an alert needs an expression")
        if len(expr) > MAX_EDIT_EXPR or "\0" in expr:
            raise EditError(f"expr: at most {MAX_EDIT_EXPR} characters of text")
        hold = form.get("for", "").strip()
        if hold and not _is_duration(hold):
            raise EditError(f"for: a duration such as 10s or 1m, or empty for none, got {hold!r}")
        threshold = form.get("threshold", "").strip() or None
        if threshold is not None and alert.threshold is None:
            raise EditError(f"threshold: {alert.name} reads no threshold recording of its own")
        if threshold is not None and not NUMBER.fullmatch(threshold):
            raise EditError(f"threshold: a number such as 2 or 1.5, got {threshold!r}")
        return cls(
            alert,
            None if expr.strip() == alert.expr.strip() else expr,
            None if hold == alert.hold else hold,
            None if threshold == alert.threshold else threshold,
        )

    def text(self) -> tuple[str, str]:
        """(the file's text now, its text with the edit)."""
        old = self.alert.file.read_text()
        return old, edit_text(old, self.alert.name, self.expr, self.hold, self.threshold)

    def sweep(self) -> str:
        """A sweep of the edited alert around the edited value, its threshold's, else its for:'s,
        and through the value in force: the backtest marks that one, and the edit (its first row)."""
        name = self.alert.name
        reads = f'{THRESHOLD}{{alertname="{name}"}}' in re.sub(r"\s+", "", self.expr or self.alert.expr)
        if (self.threshold or self.alert.threshold) is not None and reads:
            t = float(self.threshold or self.alert.threshold)
            values = {float(f"{t * f:.3g}") for f in THRESHOLD_FACTORS} | {float(self.alert.threshold or t)}
            return f"{name}=" + ",".join(f"{v:g}" for v in sorted(values - {t}))
        hold = self.hold if self.hold is not None else self.alert.hold
        seconds = int(duration_seconds(hold or "0s", "for"))
        values = {max(0, seconds + d) for d in FOR_STEPS_S} | {int(duration_seconds(self.alert.hold or "0s", "for"))}
        return f"{name}.for=" + ",".join(f"{v}s" for v in sorted(values - {seconds}))


def _is_duration(text: str) -> bool:
    try:
        return duration_seconds(text, "for") >= 0
    except DurationError:
        return False


# --- the pages ---


class Workbench:
    """The Rules page's state: one writer at a time, a bounded number of backtests, and the
    plots of recent backtests.

    `applying` is an asyncio lock, taken in the event loop and never held by a thread: a
    threading.Lock held across an `await` hung the console for good at a second Apply (issue
    40, N1). A second Apply, or a backtest past MAX_BACKTESTS, is told to wait, not queued.
    """

    def __init__(self) -> None:
        self.applying = asyncio.Lock()
        self.backtests = 0  # running now; counted in the event loop, so no lock
        self.plots = Path(tempfile.mkdtemp(prefix="runwatch-console-plots-"))

    def plot_name(self) -> str:
        kept = sorted(self.plots.glob("*.png"), key=lambda p: p.stat().st_mtime)
        for old in kept[:-KEPT_PLOTS]:
            old.unlink(missing_ok=True)
        return f"sweep-{secrets.token_hex(8)}.png"


def _workbench(request: Request) -> Workbench:
    state = request.app.state
    if not hasattr(state, "workbench"):
        state.workbench = Workbench()
    return state.workbench


def _run(console: Any, *args: str, timeout: float, progress: bool = True, tmp: Path | None = None) -> tuple[int, str]:
    """`runwatch ARGS` as the console runs its commands; (exit status, what it printed). Without
    `progress`, a command that succeeded shows its stdout only (a backtest's report, not its
    progress lines). With `tmp`, the command's temporary files go there (TMPDIR), for the
    caller to remove whatever way the command ends.

    The command is a process group of its own, ended whole when it ends or times out: a
    backtest's Prometheus servers and workers do not outlive it (issue 40, N8)."""
    env = None if tmp is None else {**os.environ, "TMPDIR": str(tmp)}
    argv = [*console.runwatch, *args]
    proc = subprocess.Popen(argv, stdout=PIPE, stderr=PIPE, text=True, env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _end_group(proc.pid)
        proc.communicate()
        return 1, f"runwatch {args[0]} did not finish in {timeout:g} s"
    finally:
        _end_group(proc.pid)
    shown = out if proc.returncode == 0 and not progress else out + err
    return proc.returncode, shown.strip()


def _end_group(group: int) -> None:
    """SIGKILL what is left of a command's process group, and wait until none of it runs."""
    deadline = time.monotonic() + GROUP_END_S
    while time.monotonic() < deadline:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:  # the group is empty: every member has ended
            return
        time.sleep(0.05)


def _console(request: Request) -> Any:
    """The app's Console (console.app, which imports this module's routes)."""
    return request.app.state.console


async def _form(console: Any, request: Request) -> dict[str, str] | Response:
    """The POSTed form, or the response that refuses it: console.app's own checks of the
    console's token and the request's origin (make_app puts them in app.state.form)."""
    return await request.app.state.form(console, request)


def _find(request: Request) -> tuple[Any, Layout, Alert | None]:
    console = _console(request)
    layout = rules_root(console)
    name = request.path_params.get("alert", "")
    alert = next((a for a in alerts_of(layout) if a.name == name), None) if ALERT.fullmatch(name) else None
    return console, layout, alert


def rules_page(request: Request) -> Response:
    console = _console(request)
    layout = rules_root(console)
    return console.render("rules.html", alerts=alerts_of(layout), root=layout.rules_dir)


def rule_page(request: Request) -> Response:
    console, layout, alert = _find(request)
    if alert is None:
        return PlainTextResponse(f"404 no alert {request.path_params['alert']!r} in {layout.rules_dir}\n", 404)
    return _render(console, layout, alert, {})


def _render(console: Any, layout: Layout, alert: Alert, extra: dict, status: int = 200) -> Response:
    own = next((k for k, a in RECORDED_INCIDENTS.items() if a == alert.name), None)  # its incident, to overlay
    form = {"expr": alert.expr, "for": alert.hold, "threshold": alert.threshold or "", "seeds": "100-199",
            "strengths": "0.05-1", "run": "", "inject": own or "", "num_classes": "",
            **extra.pop("form", {})}  # fmt: skip
    return console.render("rule.html", status=status, alert=alert, form=form, file=alert.file.name,
                          root=layout.rules_dir, runs=_watched_runs(console), **extra)  # fmt: skip


def _watched_runs(console: Any) -> list[str]:
    """The runs Prometheus holds, newest first, for "backtest this watched run" (none if it does not answer)."""
    try:
        return console.sources.runs()
    except UnavailableError:  # the page still edits and backtests without Prometheus
        return []


async def _posted(request: Request) -> tuple[Any, Layout, Alert, dict, dict] | Response:
    """An edit's form, posted for one alert: (console, layout, alert, form, the fields shown
    back), or the response that refuses it (no such alert, a foreign origin, a bad token)."""
    console, layout, alert = _find(request)
    if alert is None:
        return PlainTextResponse("404 no such alert\n", 404)
    form = await _form(console, request)
    if isinstance(form, Response):
        return form
    shown = {k: form.get(k, "") for k in ("expr", "for", "threshold", "seeds", "strengths", "run", "inject",
                                          "num_classes")}  # fmt: skip
    return console, layout, alert, form, shown


async def backtest(request: Request) -> Response:
    posted = await _posted(request)
    if isinstance(posted, Response):
        return posted
    console, layout, alert, form, shown = posted
    try:
        edit = Edit.of(alert, form)
        _, text = edit.text()
        seeds, strengths = form.get("seeds", "").strip() or "100-199", form.get("strengths", "").strip()
        if not SEEDS.fullmatch(seeds):
            raise EditError(f"seeds: a range such as 100-199, got {seeds!r}")
        if strengths and not STRENGTHS.fullmatch(strengths):
            raise EditError(f"strengths: a range such as 0.05-1 or a list such as 0.1,0.5,1, got {strengths!r}")
    except EditError as err:
        return _render(console, layout, alert, {"form": shown, "problem": str(err)}, 400)
    bench = _workbench(request)
    if bench.backtests >= MAX_BACKTESTS:
        busy = (f"a backtest is running already (at most {MAX_BACKTESTS} at a time: each trains on every core); "
                "wait for it to finish, then backtest again")  # fmt: skip
        return _render(console, layout, alert, {"form": shown, "problem": busy}, 429)
    bench.backtests += 1
    try:
        run = (console, bench, layout, alert, text, edit.sweep(), seeds, strengths)
        code, said, plot, table = await _backtest_run(*run)
    finally:
        bench.backtests -= 1
    result = {"form": shown, "backtest": said, "ok": code == 0, "plot": plot, "sweep": edit.sweep(), "table": table}
    return _render(console, layout, alert, result, 200 if code == 0 else 400)


async def _backtest_run(
    console: Any, bench: Workbench, layout: Layout, alert: Alert, text: str, sweep: str, seeds: str, strengths: str
) -> tuple[int, str, str | None, dict | None]:
    """`runwatch backtest` of a copy of the rules with the edit, as an edit of the rules the page
    read (--edit-of: the rule in force is evaluated beside the edit): (exit status, its report,
    its plot's name, its trade-off table from its --json). Its temporary files (its own and its
    Prometheus servers') go under a folder removed here, however it ends: a kill -9 of it runs
    no cleanup of its own."""
    plot = bench.plot_name()
    with tempfile.TemporaryDirectory(prefix="runwatch-console-backtest-") as tmp:
        rules, scratch, report = Path(tmp) / "rules", Path(tmp) / "tmp", Path(tmp) / "backtest.json"
        copy_folder(layout.rules_dir, rules, ignore=shutil.ignore_patterns("*.previous"))
        (rules / alert.file.name).write_text(text)
        scratch.mkdir()
        args = ["backtest", f"--rules={rules}", f"--edit-of={layout.rules_dir}", f"--seeds={seeds}",
                f"--sweep={sweep}", f"--plot={bench.plots / plot}", f"--json={report}",
                *([f"--strengths={strengths}"] if strengths else [])]  # fmt: skip
        code, said = await run_in_threadpool(
            _run, console, *args, timeout=BACKTEST_TIMEOUT_S, progress=False, tmp=scratch
        )
        table = json.loads(report.read_text())["summary"]["sweep"]["table"] if code == 0 else None
    return code, said, plot if code == 0 else None, table


async def recorded(request: Request) -> Response:
    """The "backtest this watched run" button: `runwatch backtest --from-prometheus` over one run Prometheus
    holds, under a copy of the rules with the edit, with the sweep around the edited value and
    the incidents asked for overlaid on it."""
    posted = await _posted(request)
    if isinstance(posted, Response):
        return posted
    console, layout, alert, form, shown = posted
    run_id, inject, classes = (form.get(k, "").strip() for k in ("run", "inject", "num_classes"))
    try:
        edit = Edit.of(alert, form)
        _, text = edit.text()
        if not RUN_ID.fullmatch(run_id):
            raise EditError("run: choose one of the runs Prometheus holds")
        if inject and not INJECT.fullmatch(inject):
            raise EditError(f"inject: incidents such as throughput_cut:0.3,gradient_spike, got {inject!r}")
        if classes and not classes.isdigit():
            raise EditError(f"number of classes: a whole number, got {classes!r}")
    except EditError as err:
        return _render(console, layout, alert, {"form": shown, "problem": str(err)}, 400)
    bench = _workbench(request)
    if bench.backtests >= MAX_BACKTESTS:
        busy = f"a backtest is running already (at most {MAX_BACKTESTS} at a time); wait for it, then backtest again"
        return _render(console, layout, alert, {"form": shown, "problem": busy}, 429)
    bench.backtests += 1
    try:
        with tempfile.TemporaryDirectory(prefix="runwatch-console-recorded-") as tmp:
            rules, scratch = Path(tmp) / "rules", Path(tmp) / "tmp"
            copy_folder(layout.rules_dir, rules, ignore=shutil.ignore_patterns("*.previous"))
            (rules / alert.file.name).write_text(text)
            scratch.mkdir()
            args = ["backtest", f"--from-prometheus={console.sources.prometheus}", f"--run-ids={run_id}",
                    f"--rules={rules}", f"--sweep={edit.sweep()}", *([f"--inject={inject}"] if inject else []),
                    *([f"--num-classes={classes}"] if classes else [])]  # fmt: skip
            code, said = await run_in_threadpool(
                _run, console, *args, timeout=BACKTEST_TIMEOUT_S, progress=False, tmp=scratch
            )
    finally:
        bench.backtests -= 1
    result = {"form": shown, "backtest": said, "ok": code == 0, "sweep": edit.sweep(), "recorded_run": run_id}
    return _render(console, layout, alert, result, 200 if code == 0 else 400)


async def apply(request: Request) -> Response:
    posted = await _posted(request)
    if isinstance(posted, Response):
        return posted
    console, layout, alert, form, shown = posted
    try:
        edit = Edit.of(alert, form)
        old, text = edit.text()
    except EditError as err:
        return _render(console, layout, alert, {"form": shown, "problem": str(err)}, 400)
    state = console.sources.state_dir
    if text == old or state is None or not (state / "lab.json").is_file():
        problem = ("nothing to apply: the rule is as written" if text == old else
                   "Apply reloads a lab: start the console with the lab's --state-dir (runwatch up does)")  # fmt: skip
        return _render(console, layout, alert, {"form": shown, "problem": problem}, 400)
    bench = _workbench(request)
    if bench.applying.locked():  # one writer at a time; the other is told, not queued behind it
        busy = "another Apply is running: wait for it to finish, then reload this page and apply again"
        return _render(console, layout, alert, {"form": shown, "problem": busy}, 409)
    async with bench.applying:
        code, said = await run_in_threadpool(_check_and_write, console, layout, alert.file, old, text)
    if code != 0:
        headline, next_step = refusal(said)
        refused = {"refused": said, "headline": headline, "next_step": next_step}
        return _render(console, layout, alert, {"form": shown, **refused}, 400)
    _, _, now = _find(request)
    return _render(console, layout, now or alert, {"applied": said})


def _check_and_write(console: Any, layout: Layout, path: Path, old: str, text: str) -> tuple[int, str]:
    """`runwatch check` on a copy with the edit; if it passes, swap the new text in for the old
    one (the old kept as FILE.previous) and `runwatch reload`. A refused reload puts the old
    text back. Both swaps compare the file's content first (replace_if): a save made on disk
    while the checks ran is kept, and the edit is refused (issue 40, N2)."""
    changed = f"{path.name} changed on disk while you edited it: nothing was written; reload the page and edit it again"
    if path.read_text() != old:
        return 1, changed
    with tempfile.TemporaryDirectory(prefix="runwatch-console-apply-") as tmp:
        root = Path(tmp)
        for folder in ("prometheus", "alertmanager"):
            copy_folder(layout.root / folder, root / folder, ignore=shutil.ignore_patterns("*.previous"))
        (root / path.relative_to(layout.root)).write_text(text)
        # as an edit of the rules the page read: the tests that pin what it changes are left out
        check = ["check", f"--root={root}", f"--edit-of={layout.rules_dir}"]
        code, said = _run(console, *check, timeout=CHECK_TIMEOUT_S)
    if code != 0:
        return code, said.replace(str(root), str(layout.root))
    left_out = [line.strip() for line in said.splitlines() if line.strip().startswith("left out, as")]
    if not replace_if(path, old, text, keep=path.with_name(path.name + ".previous")):
        return 1, changed
    code, said = _run(console, "reload", f"--state-dir={console.sources.state_dir}", timeout=CHECK_TIMEOUT_S)
    if code != 0 and "refused" in said and not replace_if(path, text, old):
        said += f"\n{path.name} was saved on disk meanwhile: it is left as saved, not put back"
    return code, "\n".join([said, *(["unit tests " + line for line in left_out] if code == 0 else [])])


# What to do next, by the check that refused an edit: the first line of the refusal says what
# failed, this what the learner does about it. The checks' whole output follows, folded.
NEXT_STEP = {
    "promtool check rules": "Fix the expression (the editor underlines what PromQL cannot parse), then Apply again.",
    "two_runs": "With this edit an alert fires on two healthy runs, or a rule cannot evaluate with two runs at "
    "once. Backtest it to see its false alarms; raise the threshold or lengthen for:, then Apply again.",
    "promtool test rules": "A unit test that names no alert you edited fails with the edit: the edit changes what "
    "it tests. Backtest the edit, or change that test in prometheus/tests/ if you mean the change.",
    "reload": "Prometheus could not run the edited rules as they should run; the rules in force before are back. "
    "Simplify the expression, Backtest it, then Apply again.",
}
CHECKED_ALSO = ("Checking ", "SUCCESS", "FAILED:", "(")  # a check's headings, not what failed


def refusal(said: str) -> tuple[str, str]:
    """A refused Apply in one line, and what to do next, from what `runwatch check` or `runwatch
    reload` printed: the first check that failed, and its first line that says why."""
    lines = [line.strip() for line in said.splitlines() if line.strip()]
    failed = next((i for i, line in enumerate(lines) if line.startswith("FAIL  ")), None)
    if failed is None:
        reload = next((line for line in lines if "refused" in line or "changed on disk" in line), None)
        why = reload or (lines[0] if lines else "the checks failed")
        return why.removeprefix("runwatch reload: "), NEXT_STEP["reload"] if reload and "refused" in reload else ""
    name = re.split(r"\s{2,}", lines[failed])[1]
    detail = next((line for line in lines[failed + 1 :] if not line.startswith(CHECKED_ALSO)), "")
    detail = re.sub(r"(?:/[^\s:]+/)+([^/\s:]+)", r"\1", detail)  # a file by its name: the page names its folder
    step = NEXT_STEP["two_runs" if "two_runs" in detail else name] if name in NEXT_STEP else ""
    return f"{name} failed: {detail}" if detail else f"{name} failed", step


def plot_image(request: Request) -> Response:
    name = request.path_params["name"]
    folder = _workbench(request).plots
    if not re.fullmatch(r"sweep-[0-9a-f]{16}\.png", name) or not (folder / name).is_file():
        return PlainTextResponse("404 not found\n", 404)
    return FileResponse(folder / name, media_type="image/png")


def prometheus_api(request: Request) -> Response:
    """GET only, a few metadata endpoints: what the editor's completion reads, nothing it could change."""
    path = request.path_params["path"]
    if not PROXIED.fullmatch(path):
        return JSONResponse({"status": "error", "error": f"not passed through: /api/v1/{path}"}, 404)
    base = _console(request).sources.prometheus
    try:
        resp = requests.get(f"{base}/api/v1/{path}", params=list(request.query_params.multi_items()), timeout=5)
    except requests.RequestException as err:
        return JSONResponse({"status": "error", "error": f"Prometheus at {base} is not answering: {err}"}, 503)
    return Response(resp.content, resp.status_code, media_type="application/json")


ROUTES = [
    Route("/rules", rules_page),
    Route("/rules/plot/{name}", plot_image),
    Route("/rules/prometheus/api/v1/{path:path}", prometheus_api),
    Route("/rules/{alert}", rule_page),
    Route("/rules/{alert}/backtest", backtest, methods=["POST"]),
    Route("/rules/{alert}/apply", apply, methods=["POST"]),
    Route("/rules/{alert}/recorded", recorded, methods=["POST"]),
]
