"""The durable page log: one JSON line per page or ack, appended whole and fsynced before the
sender is answered, so an acknowledged page survives a crash; and the dedup set rebuilt from it.

Alertmanager re-sends alerts (repeat_interval, group changes, retries); a page is identified by
(fingerprint, startsAt, status), and repeats are counted, not stored. An ack is kept once by its
ack_id. A failed write (a full disk) is cut back, so a retry stores each page once.

Do not point two pager processes at one log: the lock that keeps lines whole is per process.

    >>> [p["alert"] for p in read_pages(Path(".runwatch/pages.jsonl"))]
    ['TrainingLossJump']
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any, TextIO

from runwatch.oncall.incidents import incidents
from runwatch.oncall.records import is_page, page_key

DEFAULT_LOG = Path(".runwatch/pages.jsonl")  # inside the lab's state directory


def _parse_pages(data: bytes, log_path: Path, stderr: TextIO | None) -> list[dict[str, Any]]:
    pages = []
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            page = json.loads(line)
        except (ValueError, RecursionError):  # torn, or nested too deeply to be a page
            page = None
        if isinstance(page, dict):
            pages.append(page)
        elif stderr is not None:
            print(f"runwatch pager: skipping unreadable line {number} of {log_path} (torn by a crash?)", file=stderr)
    return pages


def read_log(log_path: Path, stderr: TextIO | None = None) -> list[dict[str, Any]]:
    """Return every line of the log, pages and acks, oldest first, skipping torn or unreadable lines.

    Pass ``stderr`` to be told which lines were skipped. A missing log has none.
    """
    log_path = Path(log_path)
    return _parse_pages(log_path.read_bytes(), log_path, stderr) if log_path.exists() else []


def read_pages(log_path: Path, stderr: TextIO | None = None) -> list[dict[str, Any]]:
    """Return every page in the log, oldest first, skipping torn or unreadable lines (and acks).

    Pass ``stderr`` to be told which lines were skipped. A missing log has no pages.

        >>> [p["alert"] for p in read_pages(Path(".runwatch/pages.jsonl"))]
        ['TrainingLossJump']
    """
    return [p for p in read_log(log_path, stderr) if is_page(p)]


def read_incidents(log_path: Path, run_id: str | None = None) -> list[dict[str, Any]]:
    """The log's incidents (see incidents()), only those of run_id if given."""
    found = incidents(read_log(log_path))
    return found if run_id is None else [i for i in found if i["run_id"] == run_id]


class PageLog:
    """The append-only, fsynced page log and the dedup set rebuilt from it.

    Do not write to the log file from elsewhere while a PageLog holds it.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        data = self.path.read_bytes() if self.path.exists() else b""
        pages = _parse_pages(data, self.path, sys.stderr)
        self.seen = {page_key(p) for p in pages}
        last = pages[-1].get("received_at", "") if pages else ""
        self.last_received = last if isinstance(last, str) else ""  # a hand-edited null (issue 40, P1)
        # A torn last line has no newline; the next append must not glue onto it.
        self._needs_newline = bool(data) and not data.endswith(b"\n")
        self.error: str | None = None  # why the last append failed; None once one succeeds

    def writable(self) -> str | None:
        """Why the log cannot be appended to now (a read-only file or file system), or None.

        Probed by opening it for appending, as a store does: write permission bits say nothing
        to root, and a read-only mount or an immutable file refuses only the open.
        """
        if not self.path.exists():
            ok = os.access(self.path.parent, os.W_OK)
            return None if ok else f"cannot create {self.path}: its folder is not writable"
        try:
            os.close(os.open(self.path, os.O_WRONLY | os.O_APPEND))
        except OSError as err:
            return f"cannot append to {self.path}: {err.strerror or err}"
        return None

    def store(self, records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
        """Append the records not seen before in one fsynced write; return (stored, duplicates)."""
        with self._lock:
            new, keys = [], set()
            for record in records:
                key = page_key(record)
                if key not in self.seen and key not in keys:
                    new.append(record)
                    keys.add(key)
            if new:
                data = "".join(json.dumps(r) + "\n" for r in new).encode()
                self._append(b"\n" + data if self._needs_newline else data)
                self.seen |= keys
            return new, len(records) - len(new)

    def acknowledge(self, record: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
        """Store an ack line if its incident is open and unacknowledged; return (the incident
        after it, "") or (None, why not). An ack_id already stored returns its incident again,
        so a retried ack is kept once."""
        with self._lock:
            key = (record["alert"], record["run_id"])
            entries = _parse_pages(self.path.read_bytes(), self.path, None) if self.path.exists() else []
            if page_key(record) not in self.seen:
                found = {(i["alert"], i["run_id"]): i for i in incidents(entries)}.get(key)
                if found is None:
                    run = record["run_id"] or "-"
                    return None, f"{record['alert']} has no incident for run {run}: it has not paged"
                if found["acked_at"]:
                    return None, (f"{record['alert']} of run {record['run_id'] or '-'} was already acknowledged "
                                  f"by {found['acked_by']} at {found['acked_at'][11:19]}")  # fmt: skip
                data = (json.dumps(record) + "\n").encode()
                self._append(b"\n" + data if self._needs_newline else data)
                self.seen.add(page_key(record))
                entries.append(record)
            else:  # a retry only if the id acknowledged this very incident (issue 40, N17)
                kept = [e for e in entries if page_key(e) == page_key(record)]
                if not kept or (kept[0].get("alert"), kept[0].get("run_id")) != key:
                    was = f"{kept[0].get('alert')} of run {kept[0].get('run_id') or '-'}" if kept else "another ack"
                    return None, f"ack_id {record['ack_id']} already acknowledged {was}: send a new ack_id"
            found = {(i["alert"], i["run_id"]): i for i in incidents(entries)}.get(key)
            return (found, "") if found is not None else (None, f"{record['alert']} has no incident")

    def _append(self, data: bytes) -> None:
        """Append data whole and fsynced, or not at all: on a failed write (a full disk) the log
        is cut back to where it was, so Alertmanager's retry stores each page once."""
        created = not self.path.exists()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as err:  # a read-only log or file system: /-/ready says so too
            self.error = f"cannot append to {self.path}: {err.strerror or err}"
            raise
        try:
            size = os.fstat(fd).st_size
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            except OSError as err:
                try:
                    os.ftruncate(fd, size)
                except OSError:  # the log may now end in a torn line: start the next on a new one
                    self._needs_newline = True
                self.error = f"cannot append to {self.path}: {err.strerror or err}"
                raise
        finally:
            os.close(fd)
        if created:  # make the new file's directory entry durable too
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        self._needs_newline, self.error = False, None
