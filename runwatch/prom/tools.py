"""The Prometheus-family binaries the lab runs (prometheus, promtool, alertmanager, amtool),
found on PATH, and a bounded way to run the command-line tools.

    >>> run_tool([binary("promtool"), "check", "rules", "prometheus/rules/alerts.yml"]).returncode
    0
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

from runwatch.core.command import UsageError

# Where `make binaries` (prometheus/fetch-binaries.sh) puts Prometheus 3.5 and Alertmanager 0.33,
# fetched from Debian's sid: looked in first, so an older Prometheus on PATH (Debian 12's 2.42) is
# never the one the lab runs.
FETCHED = Path(
    os.environ.get("RUNWATCH_BIN")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "runwatch" / "bin"
)
INSTALL_HINT = (
    "run `make binaries` (prometheus/fetch-binaries.sh: Prometheus 3.5 and Alertmanager 0.33 from Debian's sid)"
)

# Debian names Alertmanager's binary prometheus-alertmanager; upstream calls it alertmanager.
BINARIES = {
    "prometheus": ("prometheus",),
    "promtool": ("promtool",),
    "alertmanager": ("alertmanager", "prometheus-alertmanager"),
    "amtool": ("amtool",),
}
# The rules are written for Prometheus 3's semantics (left-open range selectors): on 2.x their
# boundary cases move by a sample, so an older Prometheus or promtool is refused, not run.
MINIMUM_MAJOR = {"prometheus": 3, "promtool": 3}
VERSION = re.compile(r"^\S+, version (\S+)")


def find(name: str) -> str | None:
    """The path of a Prometheus-family binary: the fetched one, else the first on PATH."""
    for candidate in BINARIES[name]:
        if os.access(FETCHED / candidate, os.X_OK):
            return str(FETCHED / candidate)
    return next(filter(None, map(shutil.which, BINARIES[name])), None)


@functools.cache
def version(path: str) -> str:
    """What a binary says its version is (`prometheus --version`: `3.5.3+ds1`), or "unknown"."""
    try:
        proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    m = VERSION.match((proc.stdout or proc.stderr).strip())
    return m[1] if m else "unknown"


def binary(name: str) -> str:
    """The path of a Prometheus-family binary the lab can run, or a UsageError saying what to do:
    missing, or a Prometheus (promtool) older than 3."""
    path = find(name)
    if path is None:
        raise UsageError(f"{' or '.join(BINARIES[name])} not found in {FETCHED} or on PATH: {INSTALL_HINT}")
    if name in MINIMUM_MAJOR:
        found = version(path)
        major = found.split(".")[0]
        if not major.isdigit() or int(major) < MINIMUM_MAJOR[name]:
            raise UsageError(
                f"{path} is {name} {found}; the lab's rules need {name} {MINIMUM_MAJOR[name]} or later: {INSTALL_HINT}"
            )
    return path


# Debian's Alertmanager reads its default notification template from this path, compiled into the
# binary (`strings` shows it), and fails to start without it. `make binaries` keeps Debian's
# /usr/share/prometheus beside the binaries (FETCHED/share/prometheus); the lab's Alertmanager sees
# it at the compiled-in path through an overlay in a mount namespace of its own, so nothing is
# written under /usr, and a Debian prometheus-alertmanager installed or not is neither touched nor
# read. (Upstream's builds embed the template: one found on PATH runs as it is.)
DEBIAN_TEMPLATE = Path("/usr/share/prometheus/alertmanager/default.tmpl")
SHARE = FETCHED / "share"


def alertmanager_launch(path: str) -> list[str]:
    """What runs before Alertmanager's own argv (`[*launch, path, *flags]`): for the fetched Debian
    build, `unshare` into a private mount namespace (as a user, also a user namespace) whose
    /usr/share has the fetched share folder laid over it; `exec` keeps the PID and makes the
    process's command line Alertmanager's own. A UsageError when neither that nor the file at
    DEBIAN_TEMPLATE is available."""
    if Path(path).parent != FETCHED:
        return []
    share = (SHARE / "prometheus" / "alertmanager" / "default.tmpl").is_file()
    if share and (launch := _overlay_launch()):
        return launch
    if DEBIAN_TEMPLATE.is_file():  # a namespace cannot be had; the machine's own copy is there
        return []
    where = f"{SHARE}/prometheus/alertmanager/default.tmpl" if share else f"{SHARE} (none: {INSTALL_HINT})"
    raise UsageError(
        f"alertmanager (Debian's build) reads its template from {DEBIAN_TEMPLATE}, which is missing, and this "
        f"machine gives it no mount namespace to see {where} there (`unshare --mount` failed); as root: "
        f"install -D {SHARE}/prometheus/alertmanager/default.tmpl {DEBIAN_TEMPLATE}"
    )


@functools.cache
def _overlay_launch() -> list[str] | None:
    """`unshare ... sh -c 'mount ... && exec "$@"' alertmanager`, if it works here (tried once):
    root makes a mount namespace; another user needs unprivileged user namespaces too."""
    unshare, sh = shutil.which("unshare"), shutil.which("sh")
    if not unshare or not sh or any(c in str(SHARE) for c in ":,\\"):  # overlay's option separators
        return None
    mount = f"mount -t overlay runwatch-share -o {shlex.quote(f'lowerdir={SHARE}:/usr/share')} /usr/share"
    user = [] if os.geteuid() == 0 else ["--map-root-user"]
    launch = [unshare, *user, "--mount", "--propagation", "private", "--", sh, "-c", f'{mount} && exec "$@"']
    try:
        probe = subprocess.run([*launch, "probe", "test", "-r", str(DEBIAN_TEMPLATE)], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return [*launch, "alertmanager"] if probe.returncode == 0 else None


# A check by promtool or amtool that runs past this is hung, not slow: `promtool test rules` of
# every test file takes about 2 s here.
TOOL_TIMEOUT_S = 120


def run_tool(argv: list[str], timeout: float = TOOL_TIMEOUT_S, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run a Prometheus-family tool to completion, capturing its output; a tool that hangs past
    `timeout` seconds is killed and becomes a one-line UsageError naming it."""
    try:
        return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise UsageError(f"{Path(argv[0]).name} {' '.join(argv[1:3])} did not finish in {timeout:g}s; killed") from None
