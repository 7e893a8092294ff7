"""A state directory's locks: one `up` or `down` at a time (lab.lock), one drill answer at a
time (drill.lock)."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator

from runwatch.core.command import UsageError
from runwatch.lab.state import LabDir


class Locks(LabDir):
    """The state directory's advisory locks (flock), released when their block ends."""

    @contextlib.contextmanager
    def locked(self, wait: bool, name: str = "lab.lock") -> Iterator[None]:
        """Hold the state directory's lock while starting or stopping: two `up`s at once would
        each clean up the other's components. `up` does not wait for it; `down` does. A drill's
        acks and diagnosis hold another lock of the directory's, `drill.lock`."""
        try:
            self.state.mkdir(parents=True, exist_ok=True)
            fh = open(self.state / name, "a")  # noqa: SIM115 (held for the block)
        except OSError as err:
            raise UsageError(f"--state-dir: cannot use {self.state}: {err.strerror}") from None
        with fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                raise UsageError(f"another `runwatch up` or `down` is working in {self.state}: wait for it") from None
            yield
