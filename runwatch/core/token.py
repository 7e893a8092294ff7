"""The lab's pager token: what `runwatch up` writes to STATE_DIR/pager.token (owner-only), and how
every holder reads it. Alertmanager sends it on each webhook (its credentials_file), `runwatch
ack` on each ack, and `pager-serve --token-file` refuses a POST without it.

Not for the lab's other servers: this token opens the pager only.

    >>> read_token(Path(".runwatch/pager.token"), "--token-file")
    'q3J...'
"""

from __future__ import annotations

import re
from pathlib import Path

from runwatch.core.command import UsageError

TOKEN = re.compile(r"[A-Za-z0-9_-]{16,}")  # what runwatch up writes: secrets.token_urlsafe(32)


def read_token(path: Path, flag: str) -> str:
    """The token a file holds; a UsageError naming the flag if it cannot be read or holds none."""
    try:
        token = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{flag}: cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    if not TOKEN.fullmatch(token):
        raise UsageError(f"{flag}: {path} does not hold a token (16 or more of A-Z a-z 0-9 - _)")
    return token


def bearer(token: str | None) -> dict[str, str]:
    """The header that carries a token, none without one."""
    return {"Authorization": f"Bearer {token}"} if token else {}
