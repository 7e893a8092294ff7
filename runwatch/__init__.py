"""runwatch: an observability lab for a training run (Plate XV.6, "Watching a Run").

One import namespace. Its parts, in the order the data flows, lowest first:

    runwatch.core       names, ports, files written whole, the usage error and parser: imports nothing of the project
    runwatch.trainer    the workshop's training run (trainer/ at the top of the checkout)
    runwatch.exporter   the run's /metrics (exporter/)
    runwatch.prom       the Prometheus-family binaries: find, run, check, query
    runwatch.readouts   the dashboards' queries and the plate picture they draw
    runwatch.cluster    `train --ranks N`: the MPI launcher, its targets, the flight recorder
    runwatch.backtest   `runwatch backtest`: many runs through a throwaway Prometheus
    runwatch.lab        `runwatch up | down | status | reload`: the native lab and its supervision
    runwatch.drill      `runwatch drill | ack | diagnose | postmortem`, and the sealed answer
    runwatch.oncall     the pager, Alertmanager's webhook receiver (oncall/): stands alone, over HTTP
    runwatch.console    the on-call web console (console/): reads the others over HTTP
    runwatch.cli        the `runwatch` command, which dispatches to the subcommands above

Alert logic lives in the PromQL rule files (prometheus/rules/), never here.
"""

from pathlib import Path as _Path

# Run from a checkout (a clone, an editable install, or `python -m runwatch` in another worktree),
# trainer/, exporter/, oncall/ and console/ beside this folder are this runwatch's own: found
# through the package's path, so each checkout runs its own code, never another's install. A
# wheel has them inside runwatch/ and no pyproject.toml beside it, so nothing is added there.
_checkout = _Path(__file__).resolve().parent.parent
if (_checkout / "pyproject.toml").is_file() and all(
    (_checkout / part / "__init__.py").is_file() for part in ("trainer", "exporter", "oncall", "console")
):
    __path__.append(str(_checkout))
