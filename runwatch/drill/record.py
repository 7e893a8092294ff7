"""The drill's record in a lab's state directory: drill.json for this drill (its run, acks and
diagnosis), scoreboard.jsonl across drills, and the sealed answer behind them. Every drill
command (drill, ack, diagnose, postmortem) reads it here.

    >>> Drill(Path(".runwatch")).load()["run_id"]
    'drill-120000-000000'
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from runwatch.core.command import UsageError, read_json
from runwatch.core.files import write_atomic
from runwatch.lab import supervise as lab_mod
from runwatch.oncall.records import received_time
from runwatch.trainer.sealed import unseal


def now() -> float:
    return time.time()


def iso(t: float | None) -> str:
    return "-" if t is None else datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class Drill:
    """drill.json in a lab's state directory: the run, its acks and its diagnosis."""

    def __init__(self, state: Path):
        self.lab = lab_mod.Lab(state)
        self.path = self.lab.state / "drill.json"

    def load(self) -> dict:
        if not self.path.exists():
            raise UsageError(f"no drill in {self.lab.state}: start one with `runwatch drill`")
        record = read_json(self.path, "the drill's record")
        if not isinstance(record.get("run_id"), str) or not isinstance(record.get("acks"), list):
            raise UsageError(f"{self.path}: damaged (no run_id or acks); start a new drill with `runwatch drill`")
        return record

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the drill's lock: one ack or diagnosis at a time reads and rewrites drill.json."""
        if not self.path.exists():
            raise UsageError(f"no drill in {self.lab.state}: start one with `runwatch drill`")
        with self.lab.locked(wait=True, name="drill.lock"):
            yield

    def save(self, record: dict) -> None:
        write_atomic(self.path, json.dumps(record, indent=2) + "\n")

    def answer(self, record: dict) -> dict:
        try:
            return unseal(self.lab.sealed_answer(record["run_id"]))
        except FileNotFoundError:
            run_id = record["run_id"]
            raise UsageError(f"drill {run_id} has no sealed answer: was it started by `runwatch drill`?") from None
        except ValueError as err:
            raise UsageError(str(err)) from None

    def graded(self, run_id: str) -> bool:
        """Whether the scoreboard already holds a grade for this run (whatever drill.json says)."""
        return any(row.get("run_id") == run_id for row in scoreboard(self.lab.state / "scoreboard.jsonl"))


def scoreboard(path: Path) -> list[dict]:
    """The graded drills, oldest first; a line that is not a grade (torn, hand-edited) is skipped."""
    rows = []
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError, RecursionError):  # torn, or nested too deeply
                row = json.loads(line)
                if isinstance(row, dict) and isinstance(row.get("correct"), bool):
                    rows.append(row)
    return rows


def scoreboard_line(path: Path) -> str:
    rows = scoreboard(path)
    return f"scoreboard: {sum(r['correct'] for r in rows)}/{len(rows)} drills diagnosed correctly"


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:g} s"


def acked_at(incident: dict) -> float | None:
    return received_time({"received_at": incident["acked_at"]}) if incident["acked_at"] else None
