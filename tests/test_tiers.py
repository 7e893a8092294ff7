"""Every test is in exactly one tier (tests/conftest.py: `unit`, `integration`, `e2e`, or the
compose file's own `compose`), so `make test-unit` and `make test` between them leave none out.

Collection itself refuses a test marked with two tiers, or a lab user marked other than e2e;
this asks pytest, as `make` does, which tests each tier selects.
"""

from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from runwatch.core.paths import REPO

pytestmark = pytest.mark.integration  # pytest itself, in a child


def collected(marks: str) -> set[str]:
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", marks, "tests"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode in (0, 5), res.stdout + res.stderr  # 5: no test selected
    return {line for line in res.stdout.splitlines() if re.match(r"tests/\S+::", line)}


def test_every_test_is_in_exactly_one_tier():
    names = ("unit", "integration", "e2e", "compose", "", "not (unit or integration or e2e or compose)")
    with ThreadPoolExecutor(len(names)) as pool:  # six collections at once: each is mostly imports
        *tiers, everything, untiered = pool.map(collected, names)
    assert all(tiers), [len(t) for t in tiers]
    assert sum(map(len, tiers)) == len(everything)  # none in two
    assert set().union(*tiers) == everything and untiered == set()  # none in none
