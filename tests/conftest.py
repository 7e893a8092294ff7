"""Shared helpers: real binaries and free loopback ports."""

import contextlib
import http.server
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
import yaml

from runwatch.core.command import UsageError
from runwatch.core.paths import REPO
from runwatch.lab.supervise import Lab
from runwatch.prom.server import free_port  # noqa: F401 (tests import it from here)
from runwatch.prom.tools import BINARIES, binary

# Every process the tests start has its output buffered as on a learner's machine: the machines
# this suite runs on set PYTHONUNBUFFERED=1 everywhere, which hid a `runwatch up` whose last line
# never reached a pipe (issue 35). (xdist's workers start after this, so they inherit it.)
os.environ.pop("PYTHONUNBUFFERED", None)

# --- the tiers: every test in exactly one (docs/tests.md) ---
# unit: no child process (in-process servers on port 0 are allowed); integration: real binaries
# (Prometheus, promtool, runwatch itself) on free ports; e2e: a live lab. compose is its own
# (make test-compose). A test is marked explicitly, in its module (pytestmark) or on itself; a
# test that uses a lab fixture is e2e by what it uses. An unmarked test is unit, and the unit
# tier may start no child process (see _no_children): a test left unmarked that needs one fails
# at once, naming the mark it needs, rather than slipping into `make test-unit` and slowing it.
TIERS = ("unit", "integration", "e2e")
LAB_FIXTURES = {"lab", "lab_factory", "lab_state"}
TIER = pytest.StashKey[str]()


def tier_of(item: pytest.Item) -> str:
    """The tier a test is in, or a UsageError saying why it is in none or in two."""
    marked = {m.name for m in item.iter_markers() if m.name in TIERS}
    uses_lab = bool(LAB_FIXTURES & set(getattr(item, "fixturenames", ())))
    if len(marked) > 1:
        raise pytest.UsageError(f"{item.nodeid}: marked {' and '.join(sorted(marked))}; a test is in one tier")
    if uses_lab and marked - {"e2e"}:
        raise pytest.UsageError(f"{item.nodeid}: marked {marked.pop()} but uses a lab: it is e2e")
    return marked.pop() if marked else "e2e" if uses_lab else "unit"


def pytest_itemcollected(item: pytest.Item) -> None:
    """Give each test its tier's marker as it is collected, before `-m` selects by it."""
    if item.get_closest_marker("compose"):  # its own tier: make test-compose
        if any(item.get_closest_marker(t) for t in TIERS):
            raise pytest.UsageError(f"{item.nodeid}: marked compose and another tier; a test is in one tier")
        return
    tier = tier_of(item)
    item.stash[TIER] = tier
    if not item.get_closest_marker(tier):
        item.add_marker(tier)
    # The shared lab's readers, file by file, on one worker each: its lab warms up once a file.
    if "lab" in getattr(item, "fixturenames", ()):
        item.add_marker(pytest.mark.xdist_group(f"shared-lab-{item.path.stem}"))


# The order xdist hands tests out in (none depends on it): the longest first, so that none starts
# last; then the e2e tier, which mostly waits on the lab clock (one step a second), dealt in turn
# with the integration tier, which mostly computes, so the cores stay busy while labs wait; the
# short unit tests fill the end.
FIRST = ("tests/test_install.py",)  # a wheel into a fresh venv: the longest integration test


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    first = [i for i in items if i.nodeid.startswith(FIRST)]
    tier = {t: [i for i in items if i.stash.get(TIER, "") == t and i not in first] for t in TIERS}
    dealt = [i for pair in itertools.zip_longest(tier["e2e"], tier["integration"]) for i in pair if i is not None]
    rest = [i for i in items if i not in first and i.stash.get(TIER, "") not in TIERS]  # compose's
    items[:] = first + dealt + tier["unit"] + rest


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    with _no_children(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    with _no_children(item):
        return (yield)


@contextlib.contextmanager
def _no_children(item: pytest.Item):
    """In the unit tier (its fixtures included), starting a child process fails the test."""
    if item.stash.get(TIER, None) != "unit":
        yield
        return
    started: list[str] = []
    real = subprocess.Popen._execute_child

    def refuse(self, args, *rest, **kw):
        started.append(str(args[0] if isinstance(args, list | tuple) else args))
        raise RuntimeError(f"a unit test starts no child process ({started[-1]}): mark it integration")

    subprocess.Popen._execute_child = refuse
    try:
        yield
    finally:
        subprocess.Popen._execute_child = real
    if started:
        pytest.fail(f"a unit test starts no child process, this one started {started}: mark it integration")


@pytest.fixture(scope="session", autouse=True)
def own_cache(tmp_path_factory) -> Path:
    """The backtest's data cache of this test session (of each xdist worker): never the user's."""
    root = tmp_path_factory.mktemp("backtest-cache")
    os.environ["RUNWATCH_CACHE"] = str(root)  # inherited by every runwatch the tests start
    return root


def need(name: str) -> str:
    """A binary's path; fail (not skip) when it is missing: CI installs it. The Prometheus family
    is found as the lab finds it (prometheus/fetch-binaries.sh's folder first, Prometheus 3 only)."""
    if name in BINARIES:
        try:
            return binary(name)
        except UsageError as err:
            pytest.fail(str(err))
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not on PATH: `make test` installs it")
    return path


def runwatch(*args: str, cwd: Path, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """`runwatch ARGS` in a child, with env added to this process's environment."""
    return subprocess.run(
        [sys.executable, "-m", "runwatch", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env=None if env is None else {**os.environ, **env},
    )  # fmt: skip


def edit(path: Path, old: str, new: str, count: int = -1) -> None:
    """A learner's edit of a config file; the text it replaces must be there, or the test proves nothing."""
    text = path.read_text()
    assert old in text, f"{path.name} no longer contains {old!r}"
    path.write_text(text.replace(old, new, count))


def threshold(alert: str, value: str) -> str:
    """The text of an alert's threshold rule in alerts.yml, for edit(): a learner moving it.

    >>> edit(alerts, threshold("HeldOutGap", "2"), threshold("HeldOutGap", "1.5"))
    """
    return f"alertname: {alert}\n        expr: vector({value})\n"


def keep_unit_tests(root: Path, **keep: tuple[str, ...]) -> None:
    """Leave in ROOT/prometheus/tests only the unit-test files named (as `alerts=("HeldOutGap",)`
    for alerts.test.yml), each with only its groups that name one of the alerts given (all of
    them for an empty tuple). Every unit test of the shipped rules takes promtool about 20 s of
    CPU; a test of how a check reports, or of when it runs, needs the few that bear on its case.
    The repository's own check runs them all (test_check, test_edit_check)."""
    from runwatch.core.paths import Layout
    from runwatch.prom.edits import groups

    named = {f"{name}.test.yml": alerts for name, alerts in keep.items()}
    for test_file in Layout(root).rule_tests():
        if test_file.name not in named:
            test_file.unlink()
        elif named[test_file.name]:
            found = [(g, doc) for g, doc in groups(Layout(root), set(named[test_file.name])) if g.source == test_file]
            kept = [doc["tests"][0] for g, doc in found if g.named]
            assert kept, f"no group of {test_file.name} names {named[test_file.name]}"
            head = yaml.safe_load(test_file.read_text())
            # written as promtool reads it (runwatch.prom.edits: `values: 0x100` stays a string)
            test_file.write_text(yaml.safe_dump({**found[0][1], "rule_files": head["rule_files"], "tests": kept}))


def as_the_lab_s_alertmanager(state: Path) -> dict[str, str]:
    """The header a lab's pager asks of every webhook: its token, which `runwatch up` gives
    Alertmanager (state/pager.token). A test posting a page with it is a local process that
    read the lab's state directory; without it, the pager refuses the post."""
    return {"Authorization": f"Bearer {(Path(state) / 'pager.token').read_text().strip()}"}


# Prometheus's discovery manager hands target changes on at most this often (its updatert)
DISCOVERY_S = 5.0


def wait_for(predicate, timeout: float, what: str | Callable[[], str]):
    """predicate's first truthy value within `timeout` s; `what` (or what it says, asked at the
    failure: the last thing seen) names the wait in the failure."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout}s waiting for {what() if callable(what) else what}")


def metric(base: str, name: str, auth: tuple[str, str] | None = None, **labels: str) -> float:
    """The sum of a server's own samples of one metric (its /metrics), those with these labels:
    what a negative check polls, rather than sleeping (a counter says the thing has happened)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(f"{base}/metrics", timeout=5, auth=auth).text  # auth: the lab's Alertmanager asks it
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def holds(predicate, seconds: float, what: str) -> None:
    """predicate stays true for `seconds` (a bound the test takes from the configuration)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert predicate(), what
        time.sleep(0.2)


# Every loopback address the project writes, in a file a learner reads or a page they get.
LINK = re.compile(r"http://127\.0\.0\.1:(\d+)[^\s`)'\"<>|,*]*")
GRAFANA_PORT = 3000  # compose's Grafana: the native lab has none, and the compose test does not start it


def project_links() -> dict[str, set[str]]:
    """url -> the files that write it. Grafana's templated links (${...}) are left out."""
    files = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *(REPO / "runbooks").glob("*.md")]
    files += [*(REPO / "prometheus" / "rules").glob("*.yml"), *(REPO / "grafana" / "dashboards").glob("*.json")]
    found: dict[str, set[str]] = {}
    for f in files:
        for m in LINK.finditer(f.read_text()):
            url = m.group(0).rstrip(".:;")
            if "$" not in url:
                found.setdefault(url, set()).add(str(f.relative_to(REPO)))
    return found


class LabStart:
    """`runwatch up --detach` of a lab of its own: free ports (`--ports free`), its own state
    directory, over its own copy of the configuration (a test may edit its rules). Started at
    once and waited for by `wait`, so that several labs warm up together."""

    def __init__(self, root: Path, *up_args: str):
        for d in ("prometheus", "alertmanager", "runbooks"):
            shutil.copytree(REPO / d, root / d)
        self.root, self.state = root, root / "state"
        argv = [sys.executable, "-m", "runwatch", "up", "--root", str(root), "--state-dir", str(self.state)]
        self.proc = subprocess.Popen(
            [*argv, "--ports", "free", "--detach", *up_args], cwd=root, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self.lab: Lab | None = None

    def wait(self) -> Lab:
        if self.lab is None:
            out, _ = self.proc.communicate(timeout=120)
            assert self.proc.returncode == 0, out
            lab = Lab(self.state, self.root)
            lab.cwd = self.root
            lab.run_id = json.loads((self.state / "lab.json").read_text())["run_id"]
            self.lab = lab
        return self.lab

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        res = runwatch("down", "--state-dir", str(self.state), cwd=self.root)
        assert res.returncode == 0, res.stdout + res.stderr


@pytest.fixture
def lab_factory(tmp_path_factory):
    """start(*up_args) -> LabStart: labs of this test's own, stopped when it ends."""
    started: list[LabStart] = []

    def start(*up_args: str) -> LabStart:
        started.append(LabStart(tmp_path_factory.mktemp("lab"), *up_args))
        return started[-1]

    yield start
    for one in started:
        one.stop()


@pytest.fixture
def lab_state(tmp_path) -> Path:
    """A state directory for a lab the test starts itself (`runwatch up` or `drill`, on free
    ports); whatever a failure left running in it is stopped."""
    yield tmp_path / "state"
    runwatch("down", "--state-dir", str(tmp_path / "state"), cwd=tmp_path)


# The lab its readers share, one per xdist worker: an incident run (corrupt_shard, fast-forwarded
# near its onset) and a healthy control, both in mixed precision so that every dashboard panel,
# Lesson 20's included, has data. Its readers add what they need beside it (a trainer of their
# own, with its own run id and target; a page of their own run) and never stop or edit what it
# runs: a test that does uses a lab of its own (lab_factory).
SHARED_LAB = ("--incident", "corrupt_shard", "--fast-forward", "270", "--control", "--precision", "fp16")


@pytest.fixture(scope="session")
def lab(tmp_path_factory) -> Lab:
    one = LabStart(tmp_path_factory.mktemp("shared-lab"), *SHARED_LAB)
    try:
        yield one.wait()
    finally:
        one.stop()


@pytest.fixture(scope="session")
def browser():
    """Debian's chromium, driven by Playwright (which cannot download a browser of its own here)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=need("chromium"), args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture
def tab(browser):
    """A fresh page; any JavaScript dialog (an injected alert()) fails the test."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    yield page
    context.close()
    assert dialogs == [], f"a page ran a dialog: {dialogs}"


class _Evil(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = b"<!doctype html><title>evil.example</title><p>a page of another origin"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def evil_origin():
    """A page served from an origin that is none of the lab's: localhost on a port of its own."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Evil)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://localhost:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
