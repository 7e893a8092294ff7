"""`runwatch backtest`'s flags and dispatch: the simulated runs (runwatch.backtest.backtest), or
with `--from-prometheus` your own recorded ones (runwatch.backtest.recorded).

Only the command line's glue: neither backtest imports the other's command.

    runwatch backtest --seeds 100-199
    runwatch backtest --from-prometheus http://127.0.0.1:9090 --inject throughput_cut:0.3
"""

from __future__ import annotations

import argparse

from runwatch.backtest import backtest, recorded
from runwatch.core.command import Command


def add_arguments(p: argparse.ArgumentParser) -> Command:
    simulated = backtest.add_arguments(p)
    recorded.add_arguments(p)

    def run(args: argparse.Namespace) -> int:
        recorded.check_flags(args)
        return recorded.run(args) if args.from_prometheus is not None else simulated(args)

    return run
