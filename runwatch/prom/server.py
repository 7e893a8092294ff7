"""Start and stop a real Prometheus (or Alertmanager) process and talk to its HTTP API.

Not a mock: these are the Debian or upstream binaries, on a loopback port. Use `Process` as a
context manager so the process is stopped on every way out, Ctrl-C included.

    >>> with Process(prometheus_argv(binary("prometheus"), Path("p.yml"), Path("data"), port), ready_url) as proc:
    ...     instant(proc_url, "up")
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import requests

from runwatch.core.names import BASELINES_READY, LOOPBACK, SCRAPE_INTERVAL_S


class ProcessError(RuntimeError):
    """A server that would not start; the message carries the tail of its log."""


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies (PR_SET_PDEATHSIG), and end now
    if the parent `parent` is gone already. For the backtest's throwaway servers and workers: a
    kill -9 of the backtest (subprocess.run's timeout does one) runs no `finally`, and they
    were left running for over a minute (issue 40, N8). Elsewhere it does nothing.

    Not for a server meant to outlive the command that started it (`runwatch up --detach`). The
    signal follows the *thread* that started the child: call it in a child of the main thread.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before the request was made
        os._exit(1)


def prometheus_argv(binary: str, config: Path, tsdb: Path, port: int, *flags: str) -> list[str]:
    """A Prometheus command line: its config file, its TSDB folder, listening on loopback at
    port, then the caller's flags. The one spelling of it, for the lab, the backtest and the
    tests' own servers.

        >>> prometheus_argv("prometheus", Path("p.yml"), Path("data"), 9090, "--web.enable-lifecycle")[1:3]
        ['--config.file=p.yml', '--storage.tsdb.path=data']
    """
    listen = f"--web.listen-address={LOOPBACK}:{port}"
    return [binary, f"--config.file={config}", f"--storage.tsdb.path={tsdb}", listen, *flags]


# Ports free_port picked, each held by a socket of this process until its server is seen to
# listen on it (wait_ready) or this process ends. Bound with no SO_REUSEADDR, then given it: the
# kernel hands a held port to no other bind(0) and to no outgoing connection's local end, and
# refuses it to another picker's strict bind, while a server that binds with SO_REUSEADDR (all
# of the lab's do: Go's, http.server's, uvicorn's socket) may take it. Picking without holding
# lost a lab's console in CI: another worker's server took its port before it bound, answered
# its readiness probe, and the console exited "already in use" with the lab reported up.
_HELD: dict[int, socket.socket] = {}


def _hold(port: int) -> int | None:
    """Hold port (0: one the kernel picks) if no socket at all is bound to it; its number, else None."""
    s = socket.socket()
    try:
        s.bind((LOOPBACK, port))
    except OSError:
        s.close()
        return None
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # after the bind: the server's may share it
    port = s.getsockname()[1]
    _HELD[port] = s
    return port


def release(port: int) -> None:
    """Stop holding a port free_port picked (once its server listens on it)."""
    held = _HELD.pop(port, None)
    if held is not None:
        held.close()


def free_port() -> int:
    """A loopback port that nothing is bound to, held (_HELD) until its server listens on it."""
    port = _hold(0)
    assert port is not None  # the kernel's own pick
    return port


def free_ports_in_a_row(n: int) -> int:
    """The first of n loopback ports in a row that nothing is bound to, each held as free_port's."""
    while True:
        first = free_port()
        rest = [_hold(first + i) if first + i < 65536 else None for i in range(1, n)]
        if None not in rest:
            return first
        for port in [first, *rest]:
            if port is not None:
                release(port)


def port_is_free(port: int) -> bool:
    """Nothing listens on 127.0.0.1:port. Connections still in TIME_WAIT do not count, nor does
    a port this process or another holds for its server (_HELD): the servers we start bind with
    SO_REUSEADDR, and so does this check."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def listens(pid: int, port: int) -> bool:
    """Whether process pid, or a process it started, listens on TCP port (any address)."""
    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.Error:
        return False
    for proc in family:
        try:
            if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in proc.net_connections("tcp")):
                return True
        except psutil.Error:  # it ended meanwhile
            continue
    return False


def wait_ready(
    url: str, timeout: float, proc: subprocess.Popen | None = None, auth: tuple[str, str] | None = None
) -> bool:
    """Poll url until it answers 200 (from proc or a process it started, when given); False on
    timeout or if proc exits first. Another server that took proc's port answers too: that is
    not proc ready, and proc exits when it cannot bind. auth: basic auth, for a server that asks it."""
    port = urlsplit(url).port
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            answered = requests.get(url, timeout=1, auth=auth).status_code == 200
        except requests.RequestException:
            answered = False
        if answered and (proc is None or port is None or listens(proc.pid, port)):
            if port is not None:
                release(port)
            return True
        time.sleep(0.05)
    return False


class Process:
    """A child server process, logged to a file, stopped with SIGTERM (then SIGKILL) on exit."""

    def __init__(
        self, argv: list[str], ready_url: str, log_path: Path, timeout: float = 30.0, grace: float = 10.0,
        with_parent: bool = False,
    ):  # fmt: skip
        """timeout: seconds to become ready; grace: seconds between SIGTERM and SIGKILL;
        with_parent: it dies with this process, however this one ends (die_with_parent)."""
        self.argv, self.ready_url, self.log_path, self.timeout = argv, ready_url, Path(log_path), timeout
        self.grace, self.with_parent = grace, with_parent
        self.proc: subprocess.Popen | None = None

    def start(self) -> Process:
        log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop)
        self._log = log
        parent = os.getpid()
        self.proc = subprocess.Popen(
            self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=(lambda: die_with_parent(parent)) if self.with_parent else None,
        )  # fmt: skip
        try:
            ready = wait_ready(self.ready_url, self.timeout, self.proc)
        except BaseException:  # Ctrl-C while it starts: `with` calls no __exit__ for a failed __enter__
            self.stop()
            raise
        if not ready:
            self.stop()
            tail = self.log_path.read_text(errors="replace").strip().splitlines()[-5:]
            raise ProcessError(f"{Path(self.argv[0]).name} did not become ready: " + " | ".join(tail))
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=self.grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "_log", None):
            self._log.close()
            self._log = None

    def __enter__(self) -> Process:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class PromQLError(RuntimeError):
    """Prometheus refused a query; the message is Prometheus's."""


def _api(base: str, path: str, params: dict, timeout: float = 120) -> dict:
    resp = requests.post(f"{base}/api/v1/{path}", data=params, timeout=timeout)
    body = resp.json()
    if body.get("status") != "success":
        raise PromQLError(
            f"{body.get('errorType', 'error')}: {body.get('error', resp.text)} (query: {params['query']})"
        )
    return body["data"]


def quoted(text: str) -> str:
    """text as the inside of a PromQL string literal: a run id with `"` or `\\` in it selects
    that run, and cannot end the string and add a query of its own (query injection).

        >>> f'runwatch_train_step{{run_id="{quoted('a"} or vector(1) #')}"}}'
        'runwatch_train_step{run_id="a\\"} or vector(1) #"}'
    """
    return json.dumps(str(text), ensure_ascii=False)[1:-1]  # PromQL's escapes are Go's, which JSON's are


def query_range(base: str, query: str, start: float, end: float, step: float = 1.0) -> list[dict]:
    """The matrix result of a range query: [{"metric": {...}, "values": [[t, "v"], ...]}, ...]."""
    return _api(base, "query_range", {"query": query, "start": start, "end": end, "step": step})["result"]


def instant(base: str, query: str, time_: float | None = None, timeout: float = 120) -> list[dict]:
    params = {"query": query}
    if time_ is not None:
        params["time"] = time_
    return _api(base, "query", params, timeout)["result"]


def baselines_ready(base: str, run_id: str) -> Callable[[], bool]:
    """Asks Prometheus at `base` whether it records every baseline the alerts compare with for
    run_id (the BASELINES_READY rule, baselines.yml, says which): the live trainer's onset
    waits for it (trainer.live). A Prometheus that does not answer within a scrape interval
    is as good as one without the baselines."""
    base, query = base.rstrip("/"), f'{BASELINES_READY}{{run_id="{run_id}"}}'

    def ready() -> bool:
        try:
            return bool(instant(base, query, timeout=SCRAPE_INTERVAL_S))
        except (requests.RequestException, ValueError, PromQLError):
            return False

    return ready
