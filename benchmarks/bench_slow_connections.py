"""Slow connections against the pager and the console: threads, memory and /-/ready under load.

    python benchmarks/bench_slow_connections.py [--connections 8000] [--hold 20] [--baseline REV]
    python benchmarks/bench_slow_connections.py --trickle 60 [--hold 20] [--baseline REV]

Each server runs as the lab runs it (`runwatch pager-serve`, `runwatch console`, on loopback).
Then --connections clients connect and send half a request head (a request line and a Host,
never the blank line that ends it), and hold it: what issue 28's attack did with 8,000 of them,
which gave the old pager 6,800 threads and a /-/ready that timed out for 3.5 minutes after they
closed. While they are held the server's threads and memory are read (psutil) and /-/ready is
asked 20 times; then they close, and the time to the next 200 from /-/ready is measured.
--baseline REV measures the pager of that git revision too (its oncall/pager.py, which needs
nothing of the project's: a revision before the pager was split into modules), run side by side
under the same load.
--trickle N is issue 40's N18 instead: the pager with a token, N clients that post an ack without
it and send its body a byte a second, and five webhooks carrying the token, each timed (--hold
is their timeout).

The bound being measured is the servers' own (oncall/server.py MAX_WAITING,
HEAD_TIMEOUT_S; console/serve.py MAX_WAITING, HEAD_TIMEOUT_S): past the limit the oldest stalled
connection is closed, a stalled head is closed after HEAD_TIMEOUT_S, and /-/ready, which sends its
request at once, is served throughout.
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import requests

from runwatch.prom.server import free_port, wait_ready


def start(name: str, tmp: Path, baseline: str = "", token: str = "") -> tuple[subprocess.Popen, int]:
    """The server on a free port; the pager with `token` as its --token-file's, if given."""
    port = free_port()
    (tmp / "pager.token").write_text(token + "\n")
    if name == "pager" and baseline:  # that revision's pager module, served as pager-serve serves it
        source = subprocess.run(["git", "show", f"{baseline}:oncall/pager.py"], check=True, capture_output=True,
                                cwd=Path(__file__).parent, text=True).stdout  # fmt: skip
        (tmp / "old_pager.py").write_text(source)
        log = str(tmp / "pages.jsonl")
        serve = f"import old_pager; old_pager.make_server('127.0.0.1', {port}, {log!r}, token={token or None!r})"
        serve += ".serve_forever()"
        proc = subprocess.Popen([sys.executable, "-c", serve], cwd=tmp, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)  # fmt: skip
        assert wait_ready(f"http://127.0.0.1:{port}/-/ready", 60, proc), f"{baseline}'s pager did not start"
        return proc, port
    if name == "pager":
        argv = ["pager-serve", "--port", str(port), "--log", str(tmp / "pages.jsonl")]
        argv += ["--token-file", str(tmp / "pager.token")] if token else []
    else:
        nowhere = f"http://127.0.0.1:{free_port()}"
        argv = ["console", "--port", str(port), "--prometheus", nowhere, "--alertmanager", nowhere, "--pager", nowhere]
    proc = subprocess.Popen([sys.executable, "-m", "runwatch", *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    assert wait_ready(f"http://127.0.0.1:{port}/-/ready", 60, proc), f"{name} did not start"
    return proc, port


def ready_ms(port: int, timeout: float = 30.0) -> float | None:
    """One GET /-/ready on a fresh connection: its milliseconds, None if it failed or was not 200."""
    t0 = time.perf_counter()
    try:
        ok = requests.get(f"http://127.0.0.1:{port}/-/ready", timeout=timeout).status_code == 200
    except requests.RequestException:
        ok = False
    return (time.perf_counter() - t0) * 1000 if ok else None


def hold(port: int, n: int) -> list[socket.socket]:
    """n connections, each with half a request head sent, never finished."""
    held = []
    for _ in range(n):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(f"GET /-/ready HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode())
            held.append(s)
        except OSError:  # refused or reset: the server's limit, or the backlog full
            pass
    return held


def measure(name: str, connections: int, hold_s: float, baseline: str = "") -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start(name, Path(tmp), baseline)
        server = psutil.Process(proc.pid)
        try:
            base = {"threads": server.num_threads(), "rss_mb": server.memory_info().rss / 2**20}
            t0 = time.perf_counter()
            held = hold(port, connections)
            opened = time.perf_counter() - t0
            during = [ready_ms(port) for _ in range(20)]
            threads, rss = server.num_threads(), server.memory_info().rss / 2**20
            time.sleep(max(0.0, hold_s - (time.perf_counter() - t0)))
            still_open = 0
            for s in held:  # how many the server kept open (a closed one reads as EOF or a 503)
                s.setblocking(False)
                try:
                    s.recv(1)  # EOF or a 503: closed by the server
                except BlockingIOError:
                    still_open += 1
                except OSError:
                    pass
            for s in held:
                with contextlib.suppress(OSError):
                    s.close()
            t1 = time.perf_counter()
            first = None
            while first is None and time.perf_counter() - t1 < 300:
                first = ready_ms(port, timeout=5)
            recovered = time.perf_counter() - t1
            after = [ready_ms(port) for _ in range(20)]
        finally:
            proc.terminate()
            proc.wait(10)
    ok = [m for m in during if m is not None]
    return {
        "server": f"{name}@{baseline}" if baseline else name, "connections": connections,
        "held_open_s": round(opened, 1),
        "threads": f"{base['threads']} -> {threads}", "rss_mb": f"{base['rss_mb']:.0f} -> {rss:.0f}",
        "open_after_hold": still_open,
        "ready_during_ok": f"{len(ok)}/{len(during)}",
        "ready_during_ms_p50": round(statistics.median(ok), 1) if ok else None,
        "ready_during_ms_max": round(max(ok), 1) if ok else None,
        "ready_after_close_s": round(recovered, 2),
        "ready_after_ms_p50": round(statistics.median(m for m in after if m is not None), 1),
    }  # fmt: skip


def trickle(port: int, n: int) -> list[socket.socket]:
    """n clients that post an ack without the lab's token and send its body a byte a second."""
    held = []
    for _ in range(n):
        with contextlib.suppress(OSError):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(f"POST /api/ack HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                      "Content-Length: 4096\r\n\r\n".encode())  # fmt: skip
            held.append(s)
    return held


def measure_trickle(clients: int, hold_s: float, baseline: str = "") -> dict:
    """Issue 40, N18: webhooks carrying the token while `clients` tokenless acks trickle their bodies."""
    token = secrets.token_urlsafe(32)
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start("pager", Path(tmp), baseline, token)
        held, stop = trickle(port, clients), threading.Event()

        def drip() -> None:
            while not stop.wait(1.0):
                for s in held:
                    with contextlib.suppress(OSError):
                        s.send(b" ")

        threading.Thread(target=drip, daemon=True).start()
        times = []
        try:
            for i in range(5):
                alert = {"status": "firing", "labels": {"alertname": "Bench", "run_id": "b"}, "fingerprint": f"f{i}",
                         "startsAt": "2024-01-01T00:00:00Z"}  # fmt: skip
                t0 = time.perf_counter()
                try:
                    ok = requests.post(f"http://127.0.0.1:{port}/webhook", json={"alerts": [alert]}, timeout=hold_s,
                                       headers={"Authorization": f"Bearer {token}"}).status_code == 200  # fmt: skip
                except requests.RequestException:
                    ok = False
                times.append((time.perf_counter() - t0) * 1000 if ok else None)
        finally:
            stop.set()
            for s in held:
                s.close()
            proc.terminate()
            proc.wait(10)
    ok = [t for t in times if t is not None]
    return {
        "server": f"pager@{baseline}" if baseline else "pager", "trickling_clients": len(held),
        "webhooks_ok": f"{len(ok)}/{len(times)}", "webhook_ms_p50": round(statistics.median(ok), 1) if ok else None,
        "webhook_ms_max": round(max(ok), 1) if ok else None, "timeout_s": hold_s,
    }  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--connections", type=int, default=8000)
    p.add_argument("--hold", type=float, default=20.0, help="seconds the connections are held (past HEAD_TIMEOUT_S)")
    p.add_argument("--servers", default="pager,console")
    p.add_argument("--baseline", default="", metavar="REV", help="also measure this git revision's pager")
    p.add_argument(
        "--trickle",
        type=int,
        default=0,
        metavar="N",
        help="instead: webhooks with the token while N tokenless acks trickle (--hold: their timeout)",
    )
    args = p.parse_args()
    if args.trickle:
        for baseline in ["", *([args.baseline] if args.baseline else [])]:
            row = measure_trickle(args.trickle, args.hold, baseline)
            print("  ".join(f"{k}={v}" for k, v in row.items()), flush=True)
        return 0
    runs = [(name, "") for name in args.servers.split(",")] + ([("pager", args.baseline)] if args.baseline else [])
    for name, baseline in runs:
        row = measure(name, args.connections, args.hold, baseline)
        print("  ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
