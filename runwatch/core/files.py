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


def replace_if(path: Path, expected: str, new: str, keep: Path | None = None) -> bool:
    """Replace path's text with `new` only if it still is `expected`: a compare-and-swap on the
    file's content, for a writer that read the file, worked on it for a while (the console's
    Apply runs checks for seconds) and must not overwrite what someone saved meanwhile.

    The file is first renamed aside (atomic: from then on, whoever saves the file creates a new
    one, which is never overwritten), compared, and the new text is linked into place only if no
    one created the file meanwhile (link fails where rename would overwrite). The version
    replaced goes to `keep` when given. Returns False, writing nothing, if the file held
    something else or was saved during the swap; the last save stays. For a file only this
    process writes, write_atomic is enough.

        >>> replace_if(Path("alerts.yml"), old, edited, keep=Path("alerts.yml.previous"))
        True
    """
    path = Path(path)
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        return False
    fd, staged = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".new")
    aside = Path(staged).with_suffix(".old")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(new.encode())
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return False
        if aside.read_bytes() != expected.encode():
            _put_back(aside, path)
            return False
        try:
            os.link(staged, path)
        except FileExistsError:  # saved during the swap: that save is the last word
            aside.unlink()
            return False
        if keep is not None:
            os.replace(aside, keep)
        return True
    finally:
        Path(staged).unlink(missing_ok=True)
        aside.unlink(missing_ok=True)


def _put_back(aside: Path, path: Path) -> None:
    """Undo the rename of replace_if, unless someone saved a newer file meanwhile."""
    try:
        os.link(aside, path)
    except FileExistsError:
        pass
    aside.unlink()
