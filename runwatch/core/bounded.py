"""Reading files that may be hostile, within bounds: the rules folder, the lab's state files
(lab.json, drill.json, PID files) and `up --watch`'s target file.

A rule file can be a symlink to /dev/zero, a FIFO, gigabytes, or a YAML alias bomb; a state
file can be truncated or nested a hundred thousand levels deep. Each reader here takes regular
files only, reads at most a cap, refuses YAML aliases and says what is wrong in one line naming
the file (a BoundedReadError, a ValueError), so the component that reads keeps running.

Do not use it for files the lab appends to and follows (the page log has its own reader).

    >>> text = read_text(path, "a rule file", MAX_RULE_FILE_BYTES)
    >>> groups = load_yaml(path, "a rule file")          # no aliases, at most MAX_RULE_FILE_BYTES
    >>> record = load_json_object(path, "the lab's record")
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

MAX_RULE_FILE_BYTES = 4 << 20  # the lab's rule files are 30 KB together
MAX_STATE_FILE_BYTES = 1 << 20  # lab.json, drill.json, a PID file: a few hundred bytes each
MAX_JSON_DEPTH = 64  # the lab's own JSON is 3 levels deep


class BoundedReadError(ValueError):
    """A file that is not one to read: its message is one line naming the file."""


def regular_file(path: Path, what: str, cap: int) -> int:
    """The size of path (through a symlink: what would be read) if it is a regular file of at
    most cap bytes, else a BoundedReadError; FileNotFoundError passes through."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        raise
    except OSError as err:
        raise BoundedReadError(f"{path}: cannot read {what}: {err.strerror}") from None
    if not stat.S_ISREG(found.st_mode):
        raise BoundedReadError(f"{path}: {what} is not a regular file")
    if found.st_size > cap:
        raise BoundedReadError(f"{path}: {what} is {found.st_size} bytes, over the {cap} bytes it may be")
    return found.st_size


def read_bytes(path: Path, what: str, cap: int) -> bytes:
    """A regular file's bytes, at most cap of them; one that grew past cap while read is refused.
    O_NONBLOCK: a FIFO put in the file's place between the check and the open does not block."""
    regular_file(path, what, cap)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise BoundedReadError(f"{path}: cannot read {what}: {err.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise BoundedReadError(f"{path}: {what} is not a regular file")
        data = fh.read(cap + 1)
    if len(data) > cap:
        raise BoundedReadError(f"{path}: {what} is over the {cap} bytes it may be")
    return data


def read_text(path: Path, what: str, cap: int) -> str:
    """read_bytes, decoded as UTF-8."""
    try:
        return read_bytes(path, what, cap).decode()
    except UnicodeDecodeError as err:
        raise BoundedReadError(f"{path}: {what} is not UTF-8 text (byte {err.start})") from None


def _depth(value: object, limit: int) -> None:
    """Raise ValueError if value nests deeper than limit (iteratively: no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            raise ValueError(f"nested deeper than {limit} levels")
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, depth + 1) for child in children)


def parse_json(text: str, where: str, what: str) -> object:
    """JSON of at most MAX_JSON_DEPTH levels, or a BoundedReadError naming `where`."""
    try:
        value = json.loads(text)
        _depth(value, MAX_JSON_DEPTH)
    except RecursionError:
        raise BoundedReadError(f"{where}: {what} is damaged (nested too deeply); delete it to start afresh") from None
    except ValueError as err:
        raise BoundedReadError(f"{where}: {what} is damaged ({err}); delete it to start afresh") from None
    return value


def load_json_object(path: Path, what: str, cap: int = MAX_STATE_FILE_BYTES) -> dict:
    """A JSON object from a regular file of at most cap bytes, or one line naming the file."""
    value = parse_json(read_text(path, what, cap), str(path), what)
    if not isinstance(value, dict):
        raise BoundedReadError(f"{path}: {what} is damaged (not a JSON object); delete it to start afresh")
    return value


def load_yaml(path: Path, what: str, cap: int = MAX_RULE_FILE_BYTES) -> object:
    """YAML from a regular file of at most cap bytes, with no aliases (`*name`): an alias bomb
    of 708 bytes took a reader to MemoryError. The lab's YAML uses none."""
    return parse_yaml(read_text(path, what, cap), str(path), what)


def no_aliases_loader() -> type:
    """PyYAML's SafeLoader that raises yaml.YAMLError at an alias (`*name`), naming its line:
    `yaml.load(text, Loader=no_aliases_loader())`."""
    import yaml  # here: the JSON readers need no YAML

    class NoAliases(yaml.SafeLoader):
        def compose_node(self, parent, index):  # noqa: ANN001, ANN201 (PyYAML's hook)
            if self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark
                raise yaml.YAMLError(f"line {mark.line + 1}: an alias (*name); the lab's YAML uses none")
            return super().compose_node(parent, index)

    return NoAliases


def parse_yaml(text: str, where: str, what: str) -> object:
    """yaml.safe_load without aliases, or a BoundedReadError naming `where` and the line."""
    import yaml

    try:
        return yaml.load(text, Loader=no_aliases_loader())  # noqa: S506 (a SafeLoader)
    except RecursionError:
        raise BoundedReadError(f"{where}: {what} is nested too deeply") from None
    except yaml.YAMLError as err:
        line = " ".join(str(err).split())
        raise BoundedReadError(f"{where}: {what} is not YAML the lab reads ({line})") from None


MAX_FOLDER_BYTES = 64 << 20  # a copy of the configuration's folders: the lab's are 200 KB
MAX_FOLDER_FILES = 2000


def copy_folder(src: Path, dst: Path, cap: int = MAX_RULE_FILE_BYTES, ignore=None) -> None:  # noqa: ANN001
    """shutil.copytree of a configuration folder, reading each file as read_bytes does (regular,
    at most cap bytes), at most MAX_FOLDER_FILES files and MAX_FOLDER_BYTES in all: a NOTES.txt
    linked to /dev/zero filled TMPDIR (issue 40, N3). A BoundedReadError names the file."""
    import shutil

    copied = {"files": 0, "bytes": 0}

    def copy(source: str, target: str) -> None:
        data = read_bytes(Path(source), "a file of the configuration", cap)
        copied["files"] += 1
        copied["bytes"] += len(data)
        if copied["files"] > MAX_FOLDER_FILES or copied["bytes"] > MAX_FOLDER_BYTES:
            raise BoundedReadError(f"{src}: over {MAX_FOLDER_FILES} files or {MAX_FOLDER_BYTES} bytes to copy")
        Path(target).write_bytes(data)

    shutil.copytree(src, dst, ignore=ignore, copy_function=copy, dirs_exist_ok=True)
