"""What every subcommand shares: its one-line usage error, its parser, and checks of its flags.

Low in the house: the subcommand modules import this, and `runwatch.cli` (which dispatches to
them) imports them; nothing here imports the project.

    >>> raise UsageError("--seeds: range 9-1 runs backwards")   # runwatch backtest: --seeds: ...
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from runwatch.core.bounded import BoundedReadError, load_json_object


class UsageError(Exception):
    """Bad input from the command line or a file it names; the message names the flag or file."""


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage dump): a UsageError, which the caller prints with
    exit status 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)

    def parse_or_status(self, argv: Sequence[str] | None) -> argparse.Namespace | int:
        """parse_args for a command that runs on its own (pager, pager-serve, console): the
        namespace, or the exit status once a one-line usage error is on stderr (2) or --help
        has printed (0)."""
        try:
            return self.parse_args(argv)
        except UsageError as e:
            print(f"{self.prog}: {e}", file=sys.stderr)
            return 2
        except SystemExit as e:  # --help
            return int(e.code or 0)


Command = Callable[[argparse.Namespace], int]

DEFAULT_STATE = Path(".runwatch")


def add_state_dir(p: argparse.ArgumentParser) -> None:
    """The --state-dir flag of every command that works on a lab."""
    p.add_argument(
        "--state-dir", type=Path, default=DEFAULT_STATE, help="the lab's state directory (default .runwatch)"
    )


def state_flag(state: Path) -> str:
    """` --state-dir DIR` for a command printed for the learner to run, "" for the default one:
    a printed command works as printed, whichever state directory the lab runs in.

        >>> f"stop with `runwatch down{state_flag(Path('/tmp/lab'))}`"
        'stop with `runwatch down --state-dir /tmp/lab`'
    """
    return "" if Path(state) == DEFAULT_STATE else f" --state-dir {shlex.quote(str(state))}"


def check_writable(path: Path, flag: str) -> None:
    """Make sure a file can be created beside `path` (by creating and removing one), or raise a
    UsageError naming the flag, before any work is done."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as err:
        raise UsageError(f"{flag}: cannot write {path}: {err.strerror}") from None
    os.close(fd)
    os.unlink(tmp)


def number(kind: type[int] | type[float], low: float, high: float, low_open: bool = False) -> Callable[[str], float]:
    """An argparse `type=` that accepts only kind in [low, high] (or (low, high]): every numeric
    flag has a range a learner could mean, and its error says what the range is.

        >>> p.add_argument("--steps", type=number(int, 1, MAX_STEPS))   # --steps: must be in [1, 10000], got 0
    """

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            kind_name = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"must be {kind_name}, got {text!r}") from None
        if not ((low < value) if low_open else (low <= value)) or not value <= high:  # NaN fails both
            bounds = f"{'(' if low_open else '['}{_plain(low)}, {_plain(high)}]"
            raise argparse.ArgumentTypeError(f"must be in {bounds}, got {text}")
        return value

    return parse


def _plain(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def read_json(path: Path, what: str) -> dict:
    """A JSON object the lab wrote (lab.json, drill.json, a PID file), or a UsageError naming the
    file when it is unreadable, truncated or of the wrong shape: say what it is and what to do."""
    try:  # bounded: a regular file, capped, its nesting too (runwatch.core.bounded)
        return load_json_object(Path(path), what)
    except BoundedReadError as err:
        raise UsageError(str(err)) from None
    except OSError as err:
        raise UsageError(f"{path}: cannot read {what}: {err.strerror}") from None


def config_error(err: Exception) -> UsageError:
    """A config field's error (the trainer's ConfigError: `.field` and `.problem`) as the flag that
    sets the field: `fast_forward: must be ...` -> `--fast-forward: must be ...`."""
    return UsageError(f"{flag(err.field)}: {err.problem}")


def flag(field: str) -> str:
    """The command-line flag of a config field: `fast_forward` -> `--fast-forward`."""
    return "--" + field.replace("_", "-")
