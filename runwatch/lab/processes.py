"""A lab's processes: started in their own sessions with PID files, found again by PID, start
time and command (PIDs are reused), and stopped with all they started.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil

from runwatch.core import credentials
from runwatch.core.command import UsageError, read_json
from runwatch.core.files import write_atomic
from runwatch.lab.argv import Component
from runwatch.lab.state import LabDir
from runwatch.prom.server import wait_ready

JOB_TAG = "RUNWATCH_JOB_TAG"  # in the environment of each component and all it starts (Lab.stop)


class Interrupts:
    """Ctrl-C and SIGTERM as KeyboardInterrupt, held back while a component is started and its
    PID file written: an interrupt in between would leave a process that no PID file names."""

    held = False
    pending = False

    @classmethod
    def handle(cls, *_: object) -> None:
        if cls.held:
            cls.pending = True
        else:
            raise KeyboardInterrupt

    @classmethod
    @contextlib.contextmanager
    def held_back(cls) -> Iterator[None]:
        cls.held = True
        try:
            yield
        finally:
            cls.held = False
            if cls.pending:
                cls.pending = False
                raise KeyboardInterrupt


def started(proc: psutil.Process) -> dict[str, float]:
    """When a process started, kept with its PID: a PID the kernel reuses for another process is
    not ours. On the wall clock (`create_time`) and from boot (`since_boot`), and either matching
    will do: Linux derives the wall-clock time from a boot time that moves whenever the clock is
    stepped (NTP, a virtual machine resumed), which made every process of a lab look gone at
    once; the time from boot never moves there. Where the wall-clock time is the fixed one, it
    still matches."""
    wall = proc.create_time()
    return {"create_time": wall, "since_boot": round(wall - psutil.boot_time(), 2)}


class Processes(LabDir):
    """Starts, finds and stops a lab's components."""

    def start(self, comp: Component) -> int:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.pids.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{comp.name}.log", "ab") as log, Interrupts.held_back():
            # A session of its own: Ctrl-C in the terminal reaches `up`, which stops them in order.
            tag = secrets.token_hex(8)  # inherited by all it starts: `stop` finds them by it (_job)
            proc = subprocess.Popen(
                [*comp.launch, *comp.argv], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env={**os.environ, JOB_TAG: tag},
            )  # fmt: skip
            record = {
                "pid": proc.pid,
                **started(psutil.Process(proc.pid)),
                "argv": comp.argv,
                "launch": comp.launch,
                "ready_url": comp.ready_url,
                "url": comp.url,
                "tag": tag,
            }
            write_atomic(self.pids / f"{comp.name}.json", json.dumps(record) + "\n")
        if not wait_ready(comp.ready_url, 60, proc, auth=self.auth(comp.name)):
            raise UsageError(f"{comp.name} did not start: {self.log_tail(comp.name)}")
        return proc.pid

    def auth(self, name: str) -> tuple[str, str] | None:
        """What a client of the component carries: the password, for Alertmanager (issue 40)."""
        return credentials.basic_auth(self.state) if name == "alertmanager" else None

    def log_tail(self, name: str) -> str:
        """The last lines of a component's log, on one line, and where the rest is."""
        log = self.logs / f"{name}.log"
        tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.exists() else []
        return f"{' | '.join(tail)} (log: {log})"

    def records(self) -> dict[str, dict]:
        """Each component's PID file; one that is damaged (truncated, hand-edited) reads as
        {"damaged": why}, which names no process: nothing is stopped on its word."""
        if not self.pids.is_dir():
            return {}
        records = {}
        for path in sorted(self.pids.glob("*.json")):
            try:
                record = read_json(path, "a PID file")
                shape = {"pid": int, "argv": list}
                wrong = [k for k, kind in shape.items() if not isinstance(record.get(k), kind)]
                if wrong:  # valid JSON of the wrong shape names no process either
                    raise UsageError(f"{path}: a PID file is damaged (no {wrong[0]}); `runwatch down` removes it")
                records[path.stem] = record
            except UsageError as err:
                records[path.stem] = {"damaged": str(err)}
        return records

    @staticmethod
    def process(record: dict) -> psutil.Process | None:
        """The process we started, if it still runs: the same PID, start time and command
        (PIDs are reused)."""
        try:
            proc = psutil.Process(record["pid"])
            now = started(proc)
            same_start = any(record.get(k) is not None and record.get(k) == now[k] for k in now)
            ours = proc.cmdline() == record["argv"] and same_start
            return proc if ours and proc.status() != psutil.STATUS_ZOMBIE else None
        except (psutil.Error, KeyError, TypeError, ValueError):  # a damaged record is no process of ours
            return None

    @classmethod
    def alive(cls, record: dict) -> bool:
        return cls.process(record) is not None

    def stop(self, name: str, timeout: float = 15) -> bool:
        """SIGTERM the component if it is still ours, SIGKILL after timeout; forget its PID file."""
        path = self.pids / f"{name}.json"
        record = self.records().get(name, {})
        if "damaged" in record:
            print(f"runwatch: {record['damaged']}; if {name} still runs, stop it by hand", file=sys.stderr)
        proc = self.process(record)
        # Its whole job, not only its first process: a launcher killed -9 left mpiexec, its
        # proxy and the ranks training on, holding the trainer's port (issue 28).
        members = self._job(record)
        if proc is not None:
            proc.terminate()
            if not self._exits(record, timeout):
                proc.kill()
                self._exits(record, 5)
        if members:
            for member in members:
                with contextlib.suppress(psutil.Error):
                    member.terminate()
            _, left = psutil.wait_procs(members, timeout=timeout)
            for member in left:
                with contextlib.suppress(psutil.Error):
                    member.kill()
            psutil.wait_procs(left, timeout=5)
        path.unlink(missing_ok=True)
        return proc is not None or bool(members)

    @staticmethod
    def _job(record: dict) -> list[psutil.Process]:
        """Every other process that carries the component's tag in its environment: all that it
        started, however they were detached (mpiexec, its proxy and each rank set up sessions of
        their own) and after it died (then they are init's children, in no tree of its)."""
        tag = record.get("tag")
        if not isinstance(tag, str) or not tag:
            return []
        found = []
        for other in psutil.process_iter():
            with contextlib.suppress(psutil.Error, OSError):
                if other.pid != record.get("pid") and other.environ().get(JOB_TAG) == tag:
                    found.append(other)
        return found

    def _exits(self, record: dict, timeout: float) -> bool:
        """Wait until the process has exited. A zombie has: its parent (init, for a detached lab)
        reaps it when it will, which takes 2 s here and which psutil.wait_procs waits for."""
        deadline = time.monotonic() + timeout
        while self.process(record) is not None:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def stop_all(self) -> list[str]:
        order = ["console", "trainer", "control", "prometheus", "alertmanager", "pager"]  # readers first
        names = sorted(self.records(), key=lambda n: order.index(n) if n in order else -1)
        return [n for n in names if self.stop(n)]
