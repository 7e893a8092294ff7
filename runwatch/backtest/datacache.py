"""The backtest's loaded runs, kept between backtests: a rule edit does not change the data.

An entry is the TSDB blocks that the backtest's loading Prometheus wrote for one backtest's
runs (runwatch.remote_write), with the runs' list, under a key that hashes everything the data
follows from (trainer code and config, numpy, that Prometheus, seeds, incidents, precision, the
families loaded).
It lives in the user's cache directory, `$XDG_CACHE_HOME/runwatch/backtest` (default
`~/.cache/runwatch/backtest`), or in `$RUNWATCH_CACHE` when that is set.

An entry is never trusted: its manifest lists every file with its size and SHA-256, and an
entry that does not match it, or cannot be read, is deleted and rebuilt. Entries are written
whole (a temporary folder, renamed), so a crash or a concurrent backtest leaves no half entry.
The oldest-used entries go once the cache holds more than its cap.

An entry also keeps the results of queries run against its blocks (`result`, `keep`), each
under a hash of everything that produced it (the query text, its grid, the Prometheus), in a
file that holds that spec and its result's SHA-256: after a rule edit, only the alerts whose
query changed are evaluated again. A damaged result is deleted and evaluated afresh.

    >>> cache = DataCache(default_root(), max_bytes=512 * 2**20)
    >>> meta = cache.get(key, into=tmp / "data")    # None on a miss
    >>> cache.put(key, tmp / "data", meta)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from runwatch.core.files import write_atomic

MANIFEST = "manifest.json"
# Written first into every folder a put makes, so eviction deletes only folders the backtest
# made: a `manifest.json` or a dotted name is no proof (a `my-pwa/`, a `.notes.old/`, issue 40).
MARKER, MARKER_TEXT = (
    ".runwatch-backtest-entry",
    "written by runwatch backtest's cache; eviction may delete this folder\n",
)
BLOCKS = "blocks"
RESULTS = "results"
# a temporary entry older than this belongs to no running backtest (one takes under a minute)
ABANDONED_S = 3600


# A put's temporary folder (mkdtemp's ".<key>.<random>"), which holds the marker too.
PUT_IN_PROGRESS = re.compile(r"\.[^./]+\.[A-Za-z0-9_]+")


def ours(entry: Path) -> bool:
    """Whether a folder at the cache's root is one a put made: a real folder holding the marker,
    a small regular file with the marker's text. Anything else there is someone else's."""
    try:
        if entry.is_symlink() or not entry.is_dir() or not (entry / MARKER).is_file() or (entry / MARKER).is_symlink():
            return False
        with open(entry / MARKER, "rb") as fh:
            return fh.read(len(MARKER_TEXT) + 1) == MARKER_TEXT.encode()
    except OSError:
        return False


def _remove(path: Path) -> None:
    """Delete a file, or a directory found where a file should be."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def default_root() -> Path:
    """RUNWATCH_CACHE if set (the tests' own), else the user's cache directory."""
    if os.environ.get("RUNWATCH_CACHE"):
        return Path(os.environ["RUNWATCH_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "runwatch" / "backtest"


def key_of(parts: dict, sources: list[Path]) -> str:
    """A key for data determined by `parts` (JSON-able) and the contents of `sources`."""
    h = hashlib.sha256(json.dumps(parts, sort_keys=True).encode())
    for path in sorted(sources):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:32]


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _hash(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _files(folder: Path) -> dict[str, dict]:
    return {
        str(p.relative_to(folder)): {"bytes": p.stat().st_size, "sha256": _digest(p)}
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


class DataCache:
    """Entries under root, at most max_bytes in all (the newest entry is kept even if larger)."""

    def __init__(self, root: Path, max_bytes: int):
        self.root, self.max_bytes = Path(root), max_bytes

    def get(self, key: str, into: Path) -> dict | None:
        """Copy entry `key`'s blocks into the folder `into` (created) and return its runs'
        metadata; None if there is no entry, or a damaged one (then it is deleted)."""
        entry = self.root / key
        try:
            manifest = json.loads((entry / MANIFEST).read_text())
            if _files(entry / BLOCKS) != manifest["files"]:
                raise ValueError("files differ from the manifest")
            meta = manifest["meta"]
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, RecursionError):  # a nested manifest too
            _remove(entry)  # damaged (a file in its place, too): rebuilt by the caller
            return None
        shutil.copytree(entry / BLOCKS, into, dirs_exist_ok=True)
        os.utime(entry / MANIFEST)  # recently used: evicted last
        return meta

    def put(self, key: str, blocks: Path, meta: dict) -> None:
        """Store a copy of the folder `blocks` (its block directories only) with meta, then evict."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=self.root))
        try:
            (tmp / MARKER).write_text(MARKER_TEXT)
            for block in blocks.iterdir():  # the blocks; not Prometheus's lock, WAL or head chunks
                if block.is_dir() and (block / "meta.json").is_file():
                    shutil.copytree(block, tmp / BLOCKS / block.name)
            manifest = {"meta": meta, "files": _files(tmp / BLOCKS), "written": time.time()}
            (tmp / MANIFEST).write_text(json.dumps(manifest))
            try:
                os.rename(tmp, self.root / key)
            except OSError:  # another backtest stored the same entry first: keep that one
                shutil.rmtree(tmp, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.evict()

    def result(self, key: str, spec: dict) -> object | None:
        """The result kept with entry `key` for `spec` (JSON: what produced it); None if there is
        none, or a damaged one (then it is deleted)."""
        path = self.root / key / RESULTS / f"{_hash(spec)[:32]}.json"
        try:
            kept = json.loads(path.read_text())
            if kept["spec"] != spec or kept["sha256"] != _hash(kept["result"]):
                raise ValueError("not the result of this spec")
            return kept["result"]
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            _remove(path)  # damaged (a directory in its place, too): evaluated again by the caller
            return None

    def keep(self, key: str, spec: dict, result: object) -> None:
        """Keep `result` (JSON) for `spec` with entry `key`, if that entry is still in the cache."""
        if not (self.root / key / MANIFEST).is_file():  # evicted, or never stored
            return
        folder = self.root / key / RESULTS
        kept = json.dumps({"spec": spec, "sha256": _hash(result), "result": result})
        try:
            folder.mkdir(exist_ok=True)
            write_atomic(folder / f"{_hash(spec)[:32]}.json", kept)
        except OSError:  # evicted meanwhile by another backtest: evaluated again next time
            pass

    def evict(self) -> None:
        """Delete the least recently used entries while the cache holds more than max_bytes."""
        entries = []
        for entry in self.root.iterdir():
            if not ours(entry):
                continue  # not of ours: no marker (a `my-notes/`, a `my-pwa/` with its manifest.json)
            if PUT_IN_PROGRESS.fullmatch(entry.name):  # a put in progress, or one a crash left behind
                if time.time() - entry.stat().st_mtime > ABANDONED_S:
                    shutil.rmtree(entry, ignore_errors=True)
                continue
            try:
                used = (entry / MANIFEST).lstat().st_mtime
            except OSError:
                continue  # no manifest: not a whole entry
            size = sum(p.stat().st_size for p in entry.rglob("*") if p.is_file())
            entries.append((used, size, entry))
        total = sum(size for _, size, _ in entries)
        for _, size, entry in sorted(entries)[:-1]:  # oldest first, never the newest
            if total <= self.max_bytes:
                break
            shutil.rmtree(entry, ignore_errors=True)
            total -= size
