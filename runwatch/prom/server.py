"""Start and stop a real Prometheus (or Alertmanager) process and talk to its HTTP API.

Not a mock: these are the Debian or upstream binaries, on a loopback port. Use `Process` as a
context manager so the process is stopped on every way out, Ctrl-C included.

    >>> with Process(prometheus_argv(binary("prometheus"), Path("p.yml"), Path("data"), port), ready_url) as proc:
    ...     instant(proc_url, "up")
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import requests

from runwatch.core.names import BASELINES_READY, LOOPBACK, SCRAPE_INTERVAL_S


class ProcessError(RuntimeError):
    """A server that would not start; the message carries the tail of its log."""


def prometheus_argv(binary: str, config: Path, tsdb: Path, port: int, *flags: str) -> list[str]:
    """A Prometheus command line: its config file, its TSDB folder, listening on loopback at
    port, then the caller's flags. The one spelling of it, for the lab, the backtest and the
    tests' own servers.

        >>> prometheus_argv("prometheus", Path("p.yml"), Path("data"), 9090, "--web.enable-lifecycle")[1:3]
        ['--config.file=p.yml', '--storage.tsdb.path=data']
    """
    listen = f"--web.listen-address={LOOPBACK}:{port}"
    return [binary, f"--config.file={config}", f"--storage.tsdb.path={tsdb}", listen, *flags]


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def free_ports_in_a_row(n: int) -> int:
    """The first of n loopback ports in a row that were free a moment ago (a cluster's ranks)."""
    while True:
        first = free_port()
        if first + n <= 65536 and all(port_is_free(first + i) for i in range(1, n)):
            return first


def port_is_free(port: int) -> bool:
    """Nothing listens on 127.0.0.1:port. Connections still in TIME_WAIT do not count: the
    servers we start bind with SO_REUSEADDR, and so does this check."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def wait_ready(url: str, timeout: float, proc: subprocess.Popen | None = None) -> bool:
    """Poll url until it answers 200; False on timeout or if proc exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return True
        except requests.RequestException:
            pass
        time.sleep(0.05)
    return False


class Process:
    """A child server process, logged to a file, stopped with SIGTERM (then SIGKILL) on exit."""

    def __init__(self, argv: list[str], ready_url: str, log_path: Path, timeout: float = 30.0, grace: float = 10.0):
        """timeout: seconds to become ready; grace: seconds between SIGTERM and SIGKILL."""
        self.argv, self.ready_url, self.log_path, self.timeout = argv, ready_url, Path(log_path), timeout
        self.grace = grace
        self.proc: subprocess.Popen | None = None

    def start(self) -> Process:
        log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop)
        self._log = log
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
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
    query = f'{BASELINES_READY}{{run_id="{run_id}"}}'

    def ready() -> bool:
        try:
            return bool(instant(base, query, timeout=SCRAPE_INTERVAL_S))
        except (requests.RequestException, ValueError, PromQLError):
            return False

    return ready
