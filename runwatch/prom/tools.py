"""The Prometheus-family binaries the lab runs (prometheus, promtool, alertmanager, amtool),
found on PATH, and a bounded way to run the command-line tools.

    >>> run_tool([binary("promtool"), "check", "rules", "prometheus/rules/alerts.yml"]).returncode
    0
"""

from __future__ import annotations

import functools
import os
import re
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
