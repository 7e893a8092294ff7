"""Where the lab's configuration lives, and the binaries it runs.

The configuration is read in place from the repository (prometheus/, alertmanager/, grafana/),
so a learner's edit is what every command sees. Pass `root=` to point at a copy, as the tests do.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from runwatch.cli import UsageError

REPO = Path(__file__).resolve().parents[1]
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


class Layout:
    """The configuration files of one checkout (or of a copy of it)."""

    def __init__(self, root: Path = REPO):
        self.root = Path(root)
        self.prometheus_dir = self.root / "prometheus"
        self.prometheus_yml = self.prometheus_dir / "prometheus.yml"
        self.rules_dir = self.prometheus_dir / "rules"
        self.rule_tests_dir = self.prometheus_dir / "tests"
        self.alertmanager_yml = self.root / "alertmanager" / "alertmanager.yml"

    def rule_files(self, rules_dir: Path | None = None) -> list[Path]:
        return sorted((rules_dir or self.rules_dir).glob("*.yml"))

    def rule_tests(self) -> list[Path]:
        return sorted(self.rule_tests_dir.glob("*.test.yml"))
