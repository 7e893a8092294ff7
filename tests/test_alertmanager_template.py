"""The native lab's Alertmanager on a machine where no Debian package ever put its template.

Debian's Alertmanager reads /usr/share/prometheus/alertmanager/default.tmpl, a path compiled into
it, and does not start without it (issue 35: on a fresh machine every lab died there). The lab
lays `make binaries`' copy over that path in a mount namespace of Alertmanager's own
(runwatch.prom.tools.alertmanager_launch). Here a lab runs in a mount namespace whose
/usr/share/prometheus is an empty tmpfs, as on a machine that never had the package, whatever
this one has: its Alertmanager starts and reads runwatch's template, and nothing is written under
/usr. Mounting needs root (CI runs as root; `make test-fresh` shows the same on a bare Debian).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from runwatch.lab.supervise import Lab
from runwatch.prom.tools import DEBIAN_TEMPLATE, SHARE

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs over /usr/share/prometheus: root only"),
]

RUNWATCH = [sys.executable, "-m", "runwatch"]
UNSHARE = shutil.which("unshare") or "unshare"


def without_debians_share(argv: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    """argv in a mount namespace where /usr/share/prometheus holds nothing (an empty tmpfs over
    it, where it exists: nothing is created under /usr); what it starts stays in that namespace
    after it exits (`up --detach`'s components)."""
    hide = (
        "mount -t tmpfs runwatch-test-empty /usr/share/prometheus && " if Path("/usr/share/prometheus").exists() else ""
    )
    script = f"{hide}exec {shlex.join(argv)}"
    return subprocess.run(
        [UNSHARE, "--mount", "--propagation", "private", "--", "sh", "-c", script],
        capture_output=True, text=True, timeout=180, env=env,
    )  # fmt: skip


def test_the_labs_alertmanager_starts_with_runwatchs_template_and_writes_nothing_under_usr(tmp_path):
    usr_share_before = Path("/usr/share/prometheus").exists()
    state = tmp_path / "lab"
    res = without_debians_share([*RUNWATCH, "up", "--state-dir", str(state), "--ports", "free", "--detach"])
    try:
        assert res.returncode == 0, res.stdout + res.stderr
        am = Lab.process(Lab(state).records()["alertmanager"])
        assert am is not None  # started, and known to `down` by its own command line
        seen = Path(f"/proc/{am.pid}/root") / DEBIAN_TEMPLATE.relative_to("/")
        assert seen.read_bytes() == (SHARE / "prometheus" / "alertmanager" / "default.tmpl").read_bytes()
    finally:
        subprocess.run([*RUNWATCH, "down", "--state-dir", str(state)], capture_output=True, timeout=120)
    assert Path("/usr/share/prometheus").exists() == usr_share_before


def test_no_namespace_and_no_template_is_one_line_naming_the_file_and_the_fix(tmp_path):
    """Where `unshare` cannot be had (here: not on PATH), a missing template is said before anything starts."""
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("sh", "mkdir", "mount"):
        (tools / tool).symlink_to(shutil.which(tool))
    env = {**os.environ, "PATH": str(tools)}
    state = tmp_path / "lab"
    res = without_debians_share([*RUNWATCH, "up", "--state-dir", str(state), "--ports", "free", "--detach"], env)
    assert res.returncode == 2, res.stdout + res.stderr
    [line] = res.stderr.strip().splitlines()
    assert (
        line.startswith("runwatch up: alertmanager (Debian's build) reads its template from ")
        and str(DEBIAN_TEMPLATE) in line
    )
    assert f"install -D {SHARE}/prometheus/alertmanager/default.tmpl {DEBIAN_TEMPLATE}" in line
    assert not Lab(state).records()  # nothing was started
