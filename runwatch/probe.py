"""`runwatch probe URL`: exit 0 if URL answers 200, else 1 with one line saying why. For healthchecks.

A container healthcheck whose argv holds no spaces: Podman 4.3's Docker-compatible API splits a
healthcheck's CMD arguments at spaces (`python -c "import x; ..."` arrives as `-c import`), and
Docker does not, so `["CMD", "runwatch", "probe", "http://127.0.0.1:8000/-/ready"]` is the
one form that means the same on both. Standard library only: it runs every few seconds.

    $ runwatch probe http://127.0.0.1:9095/-/ready && echo healthy
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request

USAGE = "usage: runwatch probe URL [TIMEOUT_SECONDS]"


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2 or not argv[0].startswith(("http://", "https://")):
        print(f"runwatch probe: {USAGE}", file=sys.stderr)
        return 2
    try:
        timeout = float(argv[1]) if len(argv) == 2 else 2.0
    except ValueError:
        print(f"runwatch probe: TIMEOUT_SECONDS must be a number, got {argv[1]!r}", file=sys.stderr)
        return 2
    try:
        with urllib.request.urlopen(argv[0], timeout=timeout) as resp:
            if resp.status == 200:
                return 0
            reason = f"HTTP {resp.status}"
    except urllib.error.HTTPError as err:
        reason = f"HTTP {err.code}"
    except (urllib.error.URLError, OSError) as err:
        reason = str(getattr(err, "reason", err))
    print(f"runwatch probe: {argv[0]} is not ready: {reason}", file=sys.stderr)
    return 1
