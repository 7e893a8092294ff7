"""The `runwatch` console script: one parser, a subcommand per module.

Every usage error is one line naming the flag, with exit status 2, so a learner sees what to fix:

    $ runwatch train --incident meteor
    runwatch train: --incident: unknown incident 'meteor'; choose one of none, lr_spike, ...
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import signal
import sys
from collections.abc import Callable, Iterator, Sequence

from runwatch.core.command import Command, Parser, UsageError

# Every subcommand: its help, and the module and function that add its arguments (and return
# its handler). Only the module of the command asked for is imported: `runwatch status` or
# `runwatch ack` load no backtest and no matplotlib, and a broken module names only itself.
COMMANDS: list[tuple[str, str, str, str]] = [
    ("train", "run the workshop's training run, live or offline", "runwatch.train", "add_arguments"),
    ("check", "check the lab's YAML: promtool and amtool, as after an edit", "runwatch.check", "add_arguments"),
    ("backtest", "replay many seeds x incidents, or your recorded runs, through a real Prometheus",
     "runwatch.backtest.command", "add_arguments"),
    ("up", "start the lab natively: trainer, Prometheus, Alertmanager, pager", "runwatch.lab.up", "add_arguments"),
    ("down", "stop everything `runwatch up` started", "runwatch.lab.down", "add_arguments"),
    ("status", "show the lab's processes and whether each is ready", "runwatch.lab.status", "add_arguments"),
    ("reload", "check the YAML, then reload Prometheus and Alertmanager", "runwatch.lab.reload", "add_arguments"),
    ("plate", "draw the plate for a run from Prometheus, with the dashboard's queries", "runwatch.readouts.plate",
     "add_arguments"),
    ("query", "run a PromQL query against the lab's Prometheus (it has no web UI here)", "runwatch.query",
     "add_arguments"),
    ("drill", "start a lab whose incident (or none) is hidden: on-call practice", "runwatch.drill.drill", "add_drill"),
    ("ack", "acknowledge a page: an Alertmanager silence for the alert and its run", "runwatch.drill.ack", "add_ack"),
    ("diagnose", "name the drill's incident once; it is revealed and graded", "runwatch.drill.diagnose",
     "add_diagnose"),
    ("postmortem", "write the drill's postmortem: PagerDuty's sections, timeline, plate", "runwatch.drill.postmortem",
     "add_postmortem"),
    ("flight-recorder", "every rank's last collective and step, and the rank that lags",
     "runwatch.cluster.flight_recorder", "add_arguments"),
    ("lesson", "the lab guide's lessons: `check N` runs lesson N's checks against the lab", "runwatch.lesson",
     "add_arguments"),
]  # fmt: skip


# Subcommands that parse their own arguments (they are also runnable on their own), by module
# and function: only the one asked for is imported, so `runwatch probe`, a healthcheck run every
# few seconds, loads nothing but the standard library.
DELEGATED = {
    "pager": ("runwatch.oncall.pager", "main"),
    "pager-serve": ("runwatch.oncall.pager_serve", "main"),
    "console": ("runwatch.console.serve", "main"),
    "probe": ("runwatch.probe", "main"),
    "credentials": ("runwatch.credentials", "main"),
}


def build_parser(wanted: str | None = None) -> tuple[Parser, dict[str, Command]]:
    """The parser of every subcommand; the arguments (and handler) of `wanted` only, or of all
    of them when it is None."""
    parser = Parser(prog="runwatch", description="Observability lab for a training run (Plate XV.6).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    handlers: dict[str, Command] = {}
    for name, help_text, module, function in COMMANDS:
        p = sub.add_parser(name, help=help_text, description=help_text)
        if wanted is None or name == wanted:
            handlers[name] = getattr(importlib.import_module(module), function)(p)
    sub.add_parser("pager", help="print the on-call page log; --follow to keep watching", add_help=False)
    sub.add_parser("pager-serve", help="run the on-call pager (Alertmanager's webhook receiver)", add_help=False)
    sub.add_parser("console", help="serve the on-call console (plate, pages, runbooks, ack, diagnose)", add_help=False)
    sub.add_parser("probe", help="exit 0 if a URL answers 200: the containers' healthcheck", add_help=False)
    sub.add_parser("credentials", help="make compose's Alertmanager password (its one-shot service)", add_help=False)
    return parser, handlers


def one_line(message: object) -> str:
    """A message that may hold a log's tail, on one line."""
    return " | ".join(line.strip() for line in str(message).splitlines() if line.strip())


def main(argv: Sequence[str] | None = None) -> int:
    # Each line as it is printed, also into a pipe (`runwatch up | tee`, a supervisor, a test):
    # a block-buffered "stop with `runwatch down`" would arrive only when `up` exits.
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)
    argv = list(sys.argv[1:] if argv is None else argv)
    with interrupts_held() as interrupted:  # while the command's modules import (numpy's 0.4 s)
        command = _load(argv)
    try:
        if interrupted:
            raise KeyboardInterrupt
        return command()
    except KeyboardInterrupt:  # before the command's own handler, or one it let through
        print("runwatch: interrupted", file=sys.stderr)
        return 130


@contextlib.contextmanager
def interrupts_held() -> Iterator[list[int]]:
    """Ctrl-C (SIGINT) is noted, not raised, inside: the list it yields is non-empty after one.
    A KeyboardInterrupt raised inside an import is not reliably one: Python 3.11 wraps one raised
    in a `__set_name__` (numpy's cached_property) in a RuntimeError, and here about 1 run in 20
    ended killed by SIGINT (status -2) although main had caught it, printed its line and returned
    130. An ignored SIGINT (a job started in the background) stays ignored."""
    noted: list[int] = []
    try:
        previous = signal.getsignal(signal.SIGINT)
        if previous is not signal.SIG_IGN:
            signal.signal(signal.SIGINT, lambda signum, _frame: noted.append(signum))
    except ValueError:  # not the main thread (main() called from a test's thread): nothing to hold
        yield noted
        return
    try:
        yield noted
    finally:
        if previous is not signal.SIG_IGN:
            signal.signal(signal.SIGINT, previous)


def _load(argv: list[str]) -> Callable[[], int]:
    """The command argv asks for, its modules imported, ready to run."""
    if argv and argv[0] in DELEGATED:
        module, function = DELEGATED[argv[0]]
        return functools.partial(getattr(importlib.import_module(module), function), argv[1:])
    names = {c[0] for c in COMMANDS}
    parser, handlers = build_parser(argv[0] if argv and argv[0] in names else "")
    return functools.partial(_run, parser, handlers, argv)


def _run(parser: Parser, handlers: dict[str, Command], argv: list[str]) -> int:
    prog = "runwatch" + (f" {argv[0]}" if argv and argv[0] in handlers else "")
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 2
        return handlers[args.command](args)
    except UsageError as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a file or a server the command needed (requests' errors are OSErrors too)
        where = f"{err.filename}: " if getattr(err, "filename", None) else ""
        print(f"{prog}: {where}{one_line(err.strerror or err)}", file=sys.stderr)
        return 1
    except RuntimeError as err:  # a tool or server that failed: promserver's ProcessError, PromQLError
        print(f"{prog}: {one_line(err)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
