"""`runwatch up --watch`: the addresses of a training job of your own (runwatch.watch serves them),
which the lab scrapes as its trainer job in place of its own trainer.

Every address is one target of the trainer job: a job's ranks (rank 0 serves the training
series, every rank its own rank series) or several jobs at once. The series carry their run,
rank and node themselves, so the rules name them as they name the lab's.

    >>> watch_targets("127.0.0.1:8000,127.0.0.1:8001")
    ['127.0.0.1:8000', '127.0.0.1:8001']
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from runwatch.core.bounded import BoundedReadError, read_text

MAX_TARGETS = 256
MAX_WATCH_FILE_BYTES = 64 << 10  # 256 addresses with their comments
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?)$")


def _address(text: str, where: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not _HOST.match(host) or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{where}{text!r} is not HOST:PORT (a port in 1-65535)")
    return f"{host}:{int(port)}"


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a name too long to be a file's: the addresses themselves
        return False


def watch_targets(text: str) -> list[str]:
    """HOST:PORT[,HOST:PORT...], or a file of them, one a line (# comments): argparse's `type=`."""
    path = Path(text)
    if ":" not in text or _is_file(path):
        try:  # bounded: `--watch /dev/zero` ran out of memory, a FIFO blocked (issue 40, N24)
            lines = read_text(path, "a file of addresses", MAX_WATCH_FILE_BYTES).splitlines()
        except BoundedReadError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        except FileNotFoundError:
            problem = "neither HOST:PORT[,...] nor a readable file (No such file or directory)"
            raise argparse.ArgumentTypeError(f"{text}: {problem}") from None
        found = [
            _address(line.split("#", 1)[0].strip(), f"{text}, line {n}: ")
            for n, line in enumerate(lines, 1)
            if line.split("#", 1)[0].strip()
        ]
        if not found:
            raise argparse.ArgumentTypeError(f"{text}: names no HOST:PORT")
    else:
        found = [_address(part.strip(), "") for part in text.split(",")]
    if len(set(found)) != len(found):
        raise argparse.ArgumentTypeError(f"{text}: names an address twice")
    if len(found) > MAX_TARGETS:
        raise argparse.ArgumentTypeError(f"{text}: {len(found)} addresses, more than {MAX_TARGETS}")
    return found


# Flags that configure the lab's own trainer, which `--watch` does not start: refused beside it.
TRAINER_FLAGS = {"incident": "none", "onset": None, "fast_forward": 0, "control": False, "precision": "fp64",
                 "ranks": 1, "drill_seed": None, "no_wait_for_prometheus": False}  # fmt: skip


def check_watch(args: argparse.Namespace) -> None:
    """Refuse --watch beside a flag of the lab's own trainer, naming it."""
    from runwatch.core.command import UsageError

    for name, default in TRAINER_FLAGS.items():
        if getattr(args, name, default) != default:
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"--watch: the lab's own trainer does not run, so {flag} means nothing; drop it")
