"""runwatch installed from its wheel into a fresh venv finds its configuration outside the checkout.

`REPO = parents[1]` holds only in a checkout or an editable install; the Dockerfile and a learner's
`pip install .` get a wheel in site-packages. The wheel carries the configuration as
runwatch/configuration/ (pyproject.toml), and `runwatch check` says where it found it.

The wheel is installed with --no-deps into a venv of its own, which sees the dependencies
already installed for the tests through a path file: the test is about what the wheel holds,
and downloading numpy and matplotlib again would cost half a minute of `make test`. (The full
`pip install .` from the index into a fresh venv was run by hand and behaves the same.)
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from runwatch.core.paths import REPO

pytestmark = pytest.mark.integration


def run(argv: list[str], cwd, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RUNWATCH_ROOT", "PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow  # a venv and a pip install of its own: a minute of both cores, beside the suite's labs
def test_a_wheel_in_a_fresh_venv_checks_and_backtests_from_outside_the_checkout(tmp_path):
    wheel_dir, venv, elsewhere = tmp_path / "dist", tmp_path / "venv", tmp_path / "elsewhere"
    elsewhere.mkdir()
    # built from a copy: setuptools writes build/ and *.egg-info into the tree it builds
    junk = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".runwatch", "runs")
    shutil.copytree(REPO, tmp_path / "src", ignore=junk)
    res = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheel_dir), str(tmp_path / "src")],
              tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr
    (wheel,) = wheel_dir.glob("runwatch-*.whl")
    # one import namespace: a learner's own `trainer` or `console` module cannot collide with ours
    with zipfile.ZipFile(wheel) as zf:
        tops = {name.split("/")[0] for name in zf.namelist() if not name.split("/")[0].endswith(".dist-info")}
        assert tops == {"runwatch"}, tops
        for part in (
            "trainer/run.py",
            "exporter/metrics.py",
            "oncall/app.py",
            "console/app.py",
            "core/names.py",
            "watch.py",
            "callbacks/transformers.py",
            "callbacks/lightning.py",
        ):
            assert f"runwatch/{part}" in zf.namelist(), part
    res = run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path)
    assert res.returncode == 0, res.stderr
    # the dependencies, not the checkout: a path entry's own .pth files (the editable install's
    # finder) are not run, and the venv's own site-packages, holding the wheel, comes first
    deps = next(p for p in map(Path, site.getsitepackages()) if (p / "numpy").is_dir())
    (next((venv / "lib").glob("python3*")) / "site-packages" / "deps.pth").write_text(f"{deps}\n")
    res = run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps",
               str(wheel)], tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr

    runwatch = str(venv / "bin" / "runwatch")
    res = run([runwatch, "check"], elsewhere)
    assert res.returncode == 0, res.stdout + res.stderr
    first = res.stdout.splitlines()[0]
    assert first.startswith(f"configuration: {venv}") and "site-packages/runwatch/configuration" in first, first
    assert "(the copy installed with runwatch)" in first
    assert str(REPO) not in res.stdout  # nothing was read from the checkout
    assert res.stdout.count("ok  ") == 4

    res = run([runwatch, "backtest", "--seeds", "0-1"], elsewhere)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "10 fp64 runs (2 seeds x 5 incidents)" in res.stdout
    assert "false alarms (fired where the plate says silent): 0" in res.stdout

    # a clone in the current directory wins over the installed copy: that is where a learner edits
    res = run([runwatch, "check"], REPO / "prometheus")
    assert res.stdout.splitlines()[0] == f"configuration: {REPO} (the current directory)", res.stdout
