"""`runwatch down`: stop what `runwatch up` started, by PID, after checking each PID still runs
the command it was started with (runwatch.lab.supervise), under the lab's lock."""

from __future__ import annotations

import argparse

from runwatch.core.command import Command, add_state_dir
from runwatch.lab.supervise import Lab


def add_arguments(p: argparse.ArgumentParser) -> Command:
    add_state_dir(p)
    return down


def down(args: argparse.Namespace) -> int:
    lab = Lab(args.state_dir)
    if not lab.records():
        print(f"no lab running in {lab.state}")
        return 0
    with lab.locked(wait=True):
        print("stopped:", ", ".join(lab.stop_all()) or "nothing (all had exited)")
    return 0
