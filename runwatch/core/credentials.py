"""The native lab's Alertmanager password: `runwatch up` makes it, and every client of the lab's
Alertmanager carries it as HTTP basic auth (Prometheus, `runwatch ack`, amtool, the tests).

Alertmanager's API answers every web page: its CORS is `*`, with no flag to narrow it, and it
takes POST /-/reload from anyone. A page in the learner's browser could silence every alert
(issue 40, N19). Its exporter toolkit's --web.config.file asks each request for a password that
no page has, the CORS preflight included, so the browser never sends the silence.

Files, in state/alertmanager/, owner-only natively:
  password   the password, one line
  web.yml    Alertmanager's --web.config.file: the user and a bcrypt hash of the password
  http.yml   a client's HTTP config: amtool --http.config.file, Prometheus's basic_auth

Compose makes the same files once, in a volume of their own, with `runwatch credentials
/credentials` (a one-shot service, docker-compose.yml; runwatch/credentials.py): there they are readable by every user,
because Prometheus, Alertmanager and Grafana run as users of their own images, and only the
containers that mount the volume can reach it.

    >>> requests.get(f"{am}/api/v2/alerts", auth=basic_auth(state), timeout=5)
    $ amtool --alertmanager.url=http://127.0.0.1:9093 --http.config.file=.runwatch/alertmanager/http.yml silence query
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

from runwatch.core.bounded import BoundedReadError, read_text
from runwatch.core.command import UsageError
from runwatch.core.files import write_atomic

USER = "runwatch"
# The password is 256 random bits: no guess gets near it, whatever the hash's cost. A low cost
# keeps each check cheap (the toolkit caches a checked password; a new connection checks again).
BCRYPT_ROUNDS = 6


def folder(state: Path) -> Path:
    return Path(state) / "alertmanager"


def password_file(state: Path) -> Path:
    return folder(state) / "password"


def http_config(state: Path) -> Path:
    """The client HTTP config to give amtool (--http.config.file) or Prometheus."""
    return folder(state) / "http.yml"


def ensure(state: Path, mode: int = 0o600) -> None:
    """Make the lab's password (once: a running Alertmanager keeps asking the same) and the two
    configs that carry it, each file with `mode`."""
    import bcrypt  # here: readers of the password need no bcrypt

    folder(state).mkdir(parents=True, exist_ok=True)
    if not password_file(state).exists():
        write_atomic(password_file(state), secrets.token_urlsafe(32) + "\n", mode=mode)
    password = _password(state)
    if not (folder(state) / "web.yml").exists():
        hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=BCRYPT_ROUNDS)).decode()
        web = f"# Alertmanager's --web.config.file (`runwatch up`)\nbasic_auth_users: {json.dumps({USER: hashed})}\n"
        write_atomic(folder(state) / "web.yml", web, mode=mode)
    client = {"basic_auth": {"username": USER, "password_file": str(password_file(state).absolute())}}
    write_atomic(http_config(state), json.dumps(client, indent=2) + "\n", mode=mode)  # JSON is YAML


def _password(state: Path) -> str:
    return read_text(password_file(state), "the lab's Alertmanager password", 1024).strip()


def from_file(path: Path, flag: str) -> tuple[str, str]:
    """(user, password) from a password file a flag names (compose's volume), or one line naming
    the flag."""

    try:
        password = read_text(Path(path), "the Alertmanager password", 1024).strip()
    except (OSError, BoundedReadError) as err:
        raise UsageError(f"{flag}: {err}") from None
    if not password:
        raise UsageError(f"{flag}: {path} is empty")
    return USER, password


def basic_auth(state: Path) -> tuple[str, str] | None:
    """(user, password) for requests' auth=, or None for a lab without a password (compose's
    Alertmanager, or a state directory from before the password)."""
    try:
        return USER, _password(state)
    except (FileNotFoundError, BoundedReadError):
        return None
