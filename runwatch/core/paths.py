"""Where the lab's configuration lives: the checkout, RUNWATCH_ROOT, or the copy in the wheel.

The configuration (prometheus/, alertmanager/, runbooks/, grafana/) is read in place, so a
learner's edit is what every command sees. `config_root()` looks, in this order, in:

1. `RUNWATCH_ROOT`, when set (commands with `--root` take that first);
2. the checkout this code runs from (a clone, or an editable install of it);
3. the current directory or one of its parents, if it holds a lab's configuration (a clone,
   with runwatch installed from a wheel);
4. the copy installed with the package, `runwatch/configuration/` (from the wheel): it runs the
   lab as shipped; clone the repository to edit rules.

Pass `root=` to `Layout` to point at a copy, as the tests do.
"""

from __future__ import annotations

import os
from pathlib import Path

from runwatch.core.command import UsageError

REPO = Path(__file__).resolve().parents[2]  # the checkout, when running from one
INSTALLED = Path(__file__).resolve().parents[1] / "configuration"  # the wheel's copy (pyproject.toml)


def holds_config(root: Path) -> bool:
    """Whether root has the lab's configuration: prometheus.yml and alertmanager.yml where they belong."""
    return (root / "prometheus" / "prometheus.yml").is_file() and (root / "alertmanager" / "alertmanager.yml").is_file()


def config_root(cwd: Path | None = None) -> tuple[Path, str]:
    """(the folder holding the lab's configuration, where it was found), or a UsageError
    listing every place looked in."""
    env = os.environ.get("RUNWATCH_ROOT")
    if env:
        if not holds_config(Path(env)):
            raise UsageError(f"RUNWATCH_ROOT: {env} has no prometheus/prometheus.yml and alertmanager/alertmanager.yml")
        return Path(env), "RUNWATCH_ROOT"
    if holds_config(REPO):
        return REPO, "the checkout runwatch runs from"
    here = Path.cwd() if cwd is None else cwd
    for folder in (here, *here.parents):
        if holds_config(folder):
            return folder, "the current directory"
    if holds_config(INSTALLED):
        return INSTALLED, "the copy installed with runwatch"
    raise UsageError(
        f"no lab configuration found: looked in RUNWATCH_ROOT (unset), {REPO}, {here} and its parents, "
        f"and {INSTALLED}; run from a clone of runwatch or set RUNWATCH_ROOT"
    )


class Layout:
    """The configuration files of one checkout (or of a copy of it). Without a root, the one
    `config_root()` finds."""

    def __init__(self, root: Path | None = None):
        self.root, self.found_in = (Path(root), "--root") if root is not None else config_root()
        self.prometheus_dir = self.root / "prometheus"
        self.prometheus_yml = self.prometheus_dir / "prometheus.yml"
        self.rules_dir = self.prometheus_dir / "rules"
        self.rule_tests_dir = self.prometheus_dir / "tests"
        self.alertmanager_yml = self.root / "alertmanager" / "alertmanager.yml"
        self.runbooks_dir = self.root / "runbooks"
        self.dashboards_dir = self.root / "grafana" / "dashboards"

    def rule_files(self, rules_dir: Path | None = None) -> list[Path]:
        return sorted((rules_dir or self.rules_dir).glob("*.yml"))

    def rule_tests(self) -> list[Path]:
        return sorted(self.rule_tests_dir.glob("*.test.yml"))
