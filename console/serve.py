"""`runwatch console`: serve the on-call console until interrupted.

    runwatch console [--port 9096] [--prometheus URL] [--alertmanager URL] [--pager URL] [--state-dir DIR]

`runwatch up` starts it beside the lab, with the lab's state directory (its run and its drill).
Run alone, it reads any Prometheus, Alertmanager and pager, and links the browser to
--prometheus-link and --grafana where those differ (in compose, prometheus:9090 inside and
127.0.0.1:9090 in the browser).
"""

from __future__ import annotations

import errno
import socket
import sys
from pathlib import Path

from runwatch.core import credentials
from runwatch.core.addresses import lab_url, served_hosts
from runwatch.core.command import Parser, UsageError
from runwatch.core.names import LOOPBACK, PORTS, url
from runwatch.core.serving import bounded_h11
from runwatch.core.token import read_token

# Bounded as a production async server is (issue 28). A connection has HEAD_TIMEOUT_S to send
# a whole request head, and at most MAX_WAITING wait for theirs (then the oldest is closed: a
# client that sends its request at once is served however many stall); an idle kept-alive one
# is closed after KEEP_ALIVE_S (uvicorn's); past LIMIT_CONCURRENCY connections or requests in
# flight a request is answered 503; Starlette's thread pool (40) bounds the endpoints that
# block. Measured under slow connections by benchmarks/bench_slow_connections.py.
HEAD_TIMEOUT_S = 10.0
MAX_WAITING = 1024
KEEP_ALIVE_S = 5
LIMIT_CONCURRENCY = MAX_WAITING + 256
BACKLOG = 128


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise UsageError(f"--port: a port in 1-65535, got {text!r}")
    return int(text)


def _url(flag: str):
    def parse(text: str) -> str:
        if text and not text.startswith(("http://", "https://")):
            raise UsageError(f"{flag}: an http:// or https:// address, got {text!r}")
        return text.rstrip("/")

    return parse


def parser() -> Parser:
    p = Parser(prog="runwatch console", description="Serve the on-call console: plate, pages, runbooks, ack, diagnose.")
    p.add_argument("--host", default=LOOPBACK, help=f"address to listen on (default {LOOPBACK}: this machine only)")
    p.add_argument("--port", type=_port, default=PORTS["console"], help=f"port (default {PORTS['console']})")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="a host name the browser reaches the console by, besides this machine's loopback "
                        "(any other Host is refused: DNS rebinding)")  # fmt: skip
    for name in ("prometheus", "alertmanager", "pager"):
        p.add_argument(f"--{name}", type=_url(f"--{name}"), default=None, metavar="URL",
                       help=f"the {name} to read (default: the --state-dir's lab's, else {url(name)})")  # fmt: skip
    p.add_argument("--prometheus-link", type=_url("--prometheus-link"), default="", metavar="URL",
                   help="Prometheus as the browser reaches it (default: --prometheus)")  # fmt: skip
    p.add_argument("--grafana", type=_url("--grafana"), default="", metavar="URL",
                   help="Grafana as the browser reaches it (compose), to link its dashboard")  # fmt: skip
    p.add_argument("--pager-token-file", type=Path, default=None, metavar="PATH",
                   help="the pager's token, which each Ack carries as Alertmanager's webhooks do "
                        "(default: the --state-dir lab's pager.token; none without a state dir)")  # fmt: skip
    p.add_argument("--alertmanager-password-file", type=Path, default=None, metavar="PATH",
                   help="Alertmanager's password, which each Ack's silence carries (compose: its credentials "
                        "volume's; default: the --state-dir lab's)")  # fmt: skip
    p.add_argument("--state-dir", type=Path, default=None,
                   help="the native lab's state directory: its current run, and its drill to diagnose")  # fmt: skip
    p.add_argument("--tmp-dir", type=Path, default=None, metavar="DIR",
                   help="where the lab guide's commands write, which the Lessons page checks ($TMP: /tmp)")  # fmt: skip
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_or_status(argv)
    if isinstance(args, int):
        return args
    try:  # said now, in one line, not at the first Ack
        if args.pager_token_file is not None:
            read_token(args.pager_token_file, "--pager-token-file")
        if args.alertmanager_password_file is not None:
            credentials.from_file(args.alertmanager_password_file, "--alertmanager-password-file")
    except UsageError as err:
        print(f"{p.prog}: {err}", file=sys.stderr)
        return 2
    if args.state_dir is not None and not args.state_dir.is_dir():
        print(f"{p.prog}: --state-dir: {args.state_dir} is not a directory", file=sys.stderr)
        return 2
    try:  # where the lab of --state-dir serves what a flag does not name (runwatch.core.addresses)
        for name in ("prometheus", "alertmanager", "pager"):
            if getattr(args, name) is None:
                setattr(args, name, lab_url(args.state_dir, name) if args.state_dir else url(name))
    except UsageError as err:
        print(f"{p.prog}: --state-dir: {err}", file=sys.stderr)
        return 2
    # IPPROTO_TCP named, not left 0: asyncio sets TCP_NODELAY only on sockets that say they are
    # TCP. Without it a kept-alive connection waited 40 ms for each answer (Nagle meeting the
    # client's delayed ACK), measured by benchmarks/bench_console.py.
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as e:
        sock.close()
        why = "is already in use (--port)" if e.errno == errno.EADDRINUSE else f"cannot be bound: {e.strerror} (--host)"
        print(f"{p.prog}: {args.host}:{args.port} {why}", file=sys.stderr)
        return 2
    # Imported here: `runwatch console --help` and its usage errors need none of the web stack.
    import uvicorn

    from runwatch.console.app import make_app
    from runwatch.console.sources import Sources

    sources = Sources(args.prometheus, args.alertmanager, args.pager, args.prometheus_link, args.grafana,
                      args.state_dir.absolute() if args.state_dir else None)  # fmt: skip
    hosts = served_hosts(args.host, sock.getsockname()[1], args.allow_host)
    # Bounded as a production server is: past LIMIT_CONCURRENCY open connections and requests a
    # new one is answered 503 at once, and a connection idle (or stalled mid-headers) for
    # KEEP_ALIVE_S is closed; Starlette's thread pool (40) bounds the endpoints that block.
    # Measured under slow connections by benchmarks/bench_slow_connections.py.
    config = uvicorn.Config(
        make_app(sources, hosts=hosts, pager_token=args.pager_token_file and args.pager_token_file.absolute(),
                 alertmanager_password=args.alertmanager_password_file and args.alertmanager_password_file.absolute(),
                 lesson_tmp=args.tmp_dir and args.tmp_dir.absolute()),
        log_level="warning", access_log=False, lifespan="off",
        limit_concurrency=LIMIT_CONCURRENCY, timeout_keep_alive=KEEP_ALIVE_S, backlog=BACKLOG,
        http=bounded_h11(HEAD_TIMEOUT_S, MAX_WAITING),
    )  # fmt: skip
    print(f"{p.prog}: http://{args.host}:{args.port}/ (Prometheus {args.prometheus})", file=sys.stderr, flush=True)
    uvicorn.Server(config).run(sockets=[sock])  # stops on SIGINT and SIGTERM, as PID 1 in a container must
    return 0


if __name__ == "__main__":
    sys.exit(main())
