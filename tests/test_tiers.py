"""Every test is in exactly one tier (tests/conftest.py: `unit`, `integration`, `e2e`, or the
compose file's own `compose`), so that `make test-unit`, `make test` and `make test-compose`
between them leave none out.

Collection itself refuses a test marked with two tiers, or a lab's user marked other than e2e;
this asks pytest, as `make` does, which tests are in none.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from runwatch.core.paths import REPO

pytestmark = pytest.mark.integration  # pytest itself, in a child


def test_no_test_is_left_out_of_the_tiers():
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests",
         "-m", "not (unit or integration or e2e or compose)"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 5, res.stdout + res.stderr  # 5: collected, none selected (and no error)
    deselected = re.search(r"(\d+) deselected", res.stdout)
    assert deselected and int(deselected[1]) > 300, res.stdout  # every test was collected, and left to a tier
