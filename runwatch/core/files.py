"""Writing files whole: a reader (Prometheus's file_sd, a learner's `cat`, a resumed run) never
sees half of one, and a crash leaves the old file, not a torn one.

    >>> write_atomic(Path("run.json"), '{"status": "running"}\n')
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Write data to path via a temporary file in the same folder, fsync and rename.

    mode 0o644 by default: mkstemp's 0600 would hide run.json and reports from other readers.
    Do not use it for appends (the page log appends under its own lock).
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
