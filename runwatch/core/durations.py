"""One home for a Prometheus duration ("1h30m", "500ms", "10s"), read with Prometheus's own
grammar (prometheus/common model.ParseDuration): whole numbers of y, w, d, h, m, s and ms, each
unit at most once, largest first, or "0". Rule files, Alertmanager's routes, PromQL ranges and
offsets, and the command line's flags are all read here; tests/test_durations.py fails on a
second parser.

Do not use this for Go's durations (Alertmanager's `--timeout=1.5s`) or RFC 3339 times.

    >>> duration_seconds("1h30m"), duration_ms("1s500ms")
    (5400.0, 1500)
    >>> duration_seconds("90", "for")
    Traceback (most recent call last):
    DurationError: for: '90' is not a Prometheus duration (such as 1h30m, 10s or 500ms: ...)
"""

from __future__ import annotations

import re

from runwatch.core.command import UsageError

UNITS_MS = {"y": 365 * 86_400_000, "w": 7 * 86_400_000, "d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1000,
            "ms": 1}  # fmt: skip
# Prometheus's pattern: each unit at most once, largest first ("ms" after "s", as Prometheus has it).
GRAMMAR = re.compile("".join(rf"(?:(?P<{u}>\d+){u})?" for u in UNITS_MS))


class DurationError(UsageError, ValueError):
    """Text that is not a Prometheus duration; the message names where it came from."""


def duration_ms(text: str, where: str = "duration") -> int:
    """A Prometheus duration in whole milliseconds; DurationError naming `where` (a flag, a file's
    field) if it is not one. A leading "-" (a PromQL offset's) is kept: -5m is -300000."""
    sign, body = (-1, text[1:]) if isinstance(text, str) and text.startswith("-") else (1, text)
    m = GRAMMAR.fullmatch(body) if isinstance(body, str) else None
    if body == "0":
        return 0
    if m is None or not body:
        raise DurationError(
            f"{where}: {text!r} is not a Prometheus duration (such as 1h30m, 10s or 500ms: "
            "whole numbers of y w d h m s ms, each unit once, largest first)"
        )
    return sign * sum(int(n) * UNITS_MS[unit] for unit, n in m.groupdict().items() if n is not None)


def duration_seconds(text: str, where: str = "duration") -> float:
    """A Prometheus duration in seconds (1h30m -> 5400.0); DurationError naming `where` otherwise."""
    return duration_ms(text, where) / 1000
