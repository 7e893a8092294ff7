"""The Prometheus-family binaries the lab runs (prometheus, promtool, alertmanager, amtool),
found on PATH, and a bounded way to run the command-line tools.

    >>> run_tool([binary("promtool"), "check", "rules", "prometheus/rules/alerts.yml"]).returncode
    0
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from runwatch.core.command import UsageError

INSTALL_HINT = "apt-get install prometheus prometheus-alertmanager (Debian or Ubuntu)"

# Debian names Alertmanager's binary prometheus-alertmanager; upstream calls it alertmanager.
BINARIES = {
    "prometheus": ("prometheus",),
    "promtool": ("promtool",),
    "alertmanager": ("alertmanager", "prometheus-alertmanager"),
    "amtool": ("amtool",),
}


def binary(name: str) -> str:
    """The path of a Prometheus-family binary, or a UsageError saying what to install."""
    for candidate in BINARIES[name]:
        path = shutil.which(candidate)
        if path:
            return path
    raise UsageError(f"{' or '.join(BINARIES[name])} not found on PATH: {INSTALL_HINT}")


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
