"""`runwatch credentials DIR`: compose's Alertmanager password, made once by a one-shot service
before Alertmanager starts (docker-compose.yml). The files are runwatch.core.credentials'."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from runwatch.core.bounded import BoundedReadError
from runwatch.core.credentials import ensure, folder, password_file


def main(argv: list[str] | None = None) -> int:
    """`runwatch credentials DIR`: compose's one-shot service, before Alertmanager starts. Makes
    DIR/alertmanager/{password,web.yml,http.yml} once, readable by the other containers' users;
    an existing password is kept, so a restarted stack asks the same one."""
    p = argparse.ArgumentParser(prog="runwatch credentials", description=main.__doc__)
    p.add_argument("dir", type=Path, help="the folder of compose's credentials volume")
    args = p.parse_args(argv)
    if not args.dir.is_dir():
        print(f"{p.prog}: DIR: {args.dir} is not a directory", file=sys.stderr)
        return 2
    try:
        ensure(args.dir, mode=0o644)
        folder(args.dir).chmod(0o755)
    except (OSError, BoundedReadError) as err:
        print(f"{p.prog}: {args.dir}: {err}", file=sys.stderr)
        return 1
    print(f"{p.prog}: Alertmanager's password is in {password_file(args.dir)}", flush=True)
    return 0
