"""`runwatch pager-serve`: run the on-call pager, Alertmanager's webhook receiver, until interrupted.

    runwatch pager-serve [--host 127.0.0.1] [--port 9095] [--log PATH] [--token-file PATH] ...

`runwatch up` starts it beside the lab, with the lab's token (STATE_DIR/pager.token), which
Alertmanager's webhooks and `runwatch ack` carry. Read the page log with `runwatch pager`.
"""

from __future__ import annotations

import argparse
import errno
import signal
import sys
from pathlib import Path

from runwatch.core.command import Parser, UsageError
from runwatch.core.names import LOOPBACK, PORTS
from runwatch.core.token import read_token
from runwatch.oncall.page_log import DEFAULT_LOG
from runwatch.oncall.server import PagerServer, make_server
from runwatch.oncall.watchdog import WATCHDOG_SILENT, WATCHDOG_TIMEOUT_S

_HERE = Path(__file__).resolve().parents[1]
# The checkout's runbooks/ (oncall/ is runwatch.oncall, mapped from the top of the checkout), or,
# installed from a wheel, the copy in the runwatch package (runwatch/oncall/ beside runwatch/configuration/).
_RUNBOOK_DIRS = (_HERE / "runbooks", _HERE / "configuration" / "runbooks")
DEFAULT_RUNBOOKS = next((d for d in _RUNBOOK_DIRS if d.is_dir()), _RUNBOOK_DIRS[0])


class _Stop:
    """pager-serve's SIGTERM handler. As PID 1 in a container, SIGTERM without a handler is
    ignored and `docker compose stop` waits 10 s to SIGKILL. It is noted, never raised into
    whatever runs when it comes (an exception raised inside an import or inside the event loop's
    construction leaves them half done, and Python then ends itself with SIGINT), and passed to
    the server, which stops as on Ctrl-C, whether it is serving yet or not."""

    def __init__(self) -> None:
        self.asked = False
        self.server: PagerServer | None = None

    def __call__(self, *_: object) -> None:
        self.asked = True
        if self.server is not None:
            self.server.stop()


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(f"must be a number of seconds in (0, 86400], got {text!r}")
    return value


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 0 to 65535, got {text!r}")
    return int(text)


def _read_token(prog: str, path: Path) -> str:
    """--token-file's token; "" (said on stderr in one line) if the file holds none."""
    try:
        return read_token(path, "--token-file")
    except UsageError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return ""


def _serve_parser() -> Parser:
    parser = Parser(prog="runwatch pager-serve", description="Receive Alertmanager webhooks into the page log.")
    parser.add_argument("--host", default=LOOPBACK, help=f"address to listen on (default {LOOPBACK})")
    parser.add_argument(
        "--port", type=_port, default=PORTS["pager"], help=f"port to listen on (default {PORTS['pager']})"
    )
    parser.add_argument("--log", type=Path, default=DEFAULT_LOG, help=f"page log to append to (default {DEFAULT_LOG})")
    parser.add_argument("--runbooks", type=Path, default=DEFAULT_RUNBOOKS, help="folder served at /runbooks/")
    parser.add_argument(
        "--allow-host", action="append", default=[], metavar="NAME",
        help="a host name Alertmanager posts to, besides this machine's loopback (compose: pager); "
        "a webhook with any other Host is refused",
    )  # fmt: skip
    parser.add_argument(
        "--prometheus", default="", metavar="URL",
        help="Prometheus whose rules in force each page stores (default: none, pages carry no rule)",
    )  # fmt: skip
    parser.add_argument(
        "--token-file", type=Path, default=None, metavar="PATH",
        help="take webhooks and acks only with this file's token as their Bearer credential (runwatch up "
        "gives Alertmanager and `runwatch ack` the same file); default: any local process may post",
    )  # fmt: skip
    parser.add_argument(
        "--watchdog-timeout", type=_seconds, default=WATCHDOG_TIMEOUT_S, metavar="SECONDS",
        help=f"page {WATCHDOG_SILENT} when the Watchdog heartbeat stops this long (default {WATCHDOG_TIMEOUT_S:g})",
    )  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> int:
    """``runwatch pager-serve --host 127.0.0.1 --port 9095 --log PATH``: run the webhook receiver until interrupted."""
    parser = _serve_parser()
    args = parser.parse_or_status(argv)
    if isinstance(args, int):
        return args
    if not args.runbooks.is_dir():
        print(f"{parser.prog}: --runbooks: {args.runbooks} is not a directory", file=sys.stderr)
        return 2
    token = None if args.token_file is None else _read_token(parser.prog, args.token_file)
    if token == "":
        return 2
    # Installed before the port is bound, so a SIGTERM that comes as soon as the port answers is handled too.
    stop = _Stop()
    signal.signal(signal.SIGTERM, stop)
    try:
        server = make_server(
            args.host, args.port, args.log, runbooks=args.runbooks, watchdog_timeout=args.watchdog_timeout,
            prometheus=args.prometheus, allow_hosts=args.allow_host, token=token,
        )  # fmt: skip
    except KeyboardInterrupt:  # Ctrl-C while loading the page log
        return 0
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            print(f"{parser.prog}: port {args.port} is already in use (--port)", file=sys.stderr)
        elif e.filename is not None:
            print(f"{parser.prog}: cannot use page log {e.filename}: {e.strerror} (--log)", file=sys.stderr)
        else:
            print(
                f"{parser.prog}: cannot listen on {args.host}:{args.port}: {e.strerror or e} (--host)", file=sys.stderr
            )
        return 2
    stop.server = server
    try:
        if not stop.asked:  # else stopped while loading the page log
            host, port = server.server_address[:2]
            print(f"{parser.prog}: listening on http://{host}:{port}/webhook, page log {args.log}", file=sys.stderr)
            server.serve_forever()  # until SIGTERM or Ctrl-C, which uvicorn takes over while it serves
    except KeyboardInterrupt:  # Ctrl-C before uvicorn took it over
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
