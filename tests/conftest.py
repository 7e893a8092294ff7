"""Shared helpers: real binaries and free loopback ports."""

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runwatch.core.command import UsageError
from runwatch.core.paths import REPO
from runwatch.lab.supervise import Lab
from runwatch.prom.server import free_port  # noqa: F401 (tests import it from here)
from runwatch.prom.tools import BINARIES, binary

# --- the tiers: every test in exactly one (README, "The tests") ---
# unit: no child process (in-process servers on port 0 are allowed); integration: real binaries
# (Prometheus, promtool, runwatch itself) on free ports; e2e: a live lab. compose is its own
# (make test-compose). A test is marked explicitly, in its module (pytestmark) or on itself; a
# test that uses a lab fixture is e2e by what it uses. An unmarked test is unit, and the unit
# tier may start no child process (see _no_children): a test left unmarked that needs one fails
# at once, naming the mark it needs, rather than slipping into `make test-unit` and slowing it.
TIERS = ("unit", "integration", "e2e")
LAB_FIXTURES = {"lab", "lab_session", "lab_factory"}
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
    if item.get_closest_marker("compose"):
        return
    tier = tier_of(item)
    item.stash[TIER] = tier
    if not item.get_closest_marker(tier):
        item.add_marker(tier)
    # Until the lab takes injectable ports: every test of the session lab on one worker.
    if "lab_session" in getattr(item, "fixturenames", ()):
        item.add_marker(pytest.mark.xdist_group("fixed-ports"))


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


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


# Every loopback address the project writes, in a file a learner reads or a page they get.
LINK = re.compile(r"http://127\.0\.0\.1:(\d+)[^\s`)'\"<>|,*]*")
GRAFANA_PORT = 3000  # compose's Grafana: the native lab has none, and the compose test does not start it


def project_links() -> dict[str, set[str]]:
    """url -> the files that write it. Grafana's templated links (${...}) are left out."""
    files = [REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "runbooks").glob("*.md")]
    files += [*(REPO / "prometheus" / "rules").glob("*.yml"), *(REPO / "grafana" / "dashboards").glob("*.json")]
    found: dict[str, set[str]] = {}
    for f in files:
        for m in LINK.finditer(f.read_text()):
            url = m.group(0).rstrip(".:;")
            if "$" not in url:
                found.setdefault(url, set()).add(str(f.relative_to(REPO)))
    return found


class LabSession:
    """The session's native lab, on the default ports, over a copy of the configuration: an
    incident run (corrupt_shard, fast-forwarded near its onset) and a healthy control, both in
    mixed precision so that every dashboard panel, Lesson 20's included, has data.

    Started on first use; tests that need the ports for a lab of their own (drills) stop it,
    and the next test that asks for it starts a fresh one.
    """

    def __init__(self, tmp_path_factory):
        self.factory, self.lab = tmp_path_factory, None

    def start(self) -> Lab:
        if self.lab is None:
            root = self.factory.mktemp("checkout")
            for d in ("prometheus", "alertmanager", "runbooks"):
                shutil.copytree(REPO / d, root / d)
            state = root / "state"
            res = runwatch(
                "up", "--root", str(root), "--state-dir", str(state), "--incident", "corrupt_shard",
                "--fast-forward", "270", "--control", "--precision", "fp16", "--detach", cwd=root,
            )  # fmt: skip
            assert res.returncode == 0, res.stdout + res.stderr
            lab = Lab(state, root)
            lab.cwd = root
            lab.run_id = json.loads((state / "lab.json").read_text())["run_id"]
            self.lab = lab
        return self.lab

    def stop(self) -> None:
        if self.lab is not None:
            res = runwatch("down", "--state-dir", str(self.lab.state), cwd=self.lab.cwd)
            assert res.returncode == 0, res.stdout + res.stderr
            self.lab = None


@pytest.fixture(scope="session")
def lab_session(tmp_path_factory):
    session = LabSession(tmp_path_factory)
    yield session
    session.stop()


@pytest.fixture
def lab(lab_session) -> Lab:
    return lab_session.start()


@pytest.fixture
def no_lab(lab_session) -> None:
    """Free the default ports for a test that starts its own lab."""
    lab_session.stop()


CONSOLE = "http://127.0.0.1:9096"


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
