"""Where a lab's components listen: the documented ports, or those `runwatch up --ports` gave it.

`runwatch up` records each component's address in its state directory (lab.json, "urls"), and
every command that talks to a lab reads them there, so labs in different state directories run
side by side. A state directory without that record (no lab yet, or one started before it was
kept) means the documented ports of runwatch.core.names.

    >>> parse_ports("prometheus=19090,pager=0")  # 0: a free port, chosen when the lab starts
    {'prometheus': 19090, 'pager': 0}
    >>> lab_url(Path(".runwatch"), "prometheus")
    'http://127.0.0.1:9090'

Not for compose: its containers reach each other by service name (compose/targets/).
"""

from __future__ import annotations

from pathlib import Path

from runwatch.core.command import UsageError, read_json
from runwatch.core.names import CONTROL_PORT, LAUNCHER_PORT, LOOPBACK, PORTS, RANK_PORT_BASE

# Every port a native lab takes, by name: the five servers, the healthy control (--control),
# a cluster run's launcher and the first of its ranks' ports (--ranks; rank r on that + r).
DEFAULT_PORTS = {**PORTS, "control": CONTROL_PORT, "launcher": LAUNCHER_PORT, "ranks": RANK_PORT_BASE}


def parse_ports(text: str) -> dict[str, int]:
    """`--ports`: `free` (every component on a free port) or `NAME=PORT,...`; PORT 0 is a free one."""
    if text == "free":
        return dict.fromkeys(DEFAULT_PORTS, 0)
    ports = {}
    for part in text.split(","):
        name, _, port = part.partition("=")
        if name not in DEFAULT_PORTS:
            known = ", ".join(DEFAULT_PORTS)
            raise UsageError(f"--ports: unknown component {name!r}; name one of {known}, or say free")
        if not port.isdigit() or int(port) > 65535:
            raise UsageError(f"--ports: {name}'s port must be 0-65535 (0: a free one), got {port!r}")
        ports[name] = int(port)
    return ports


def url(port: int) -> str:
    return f"http://{LOOPBACK}:{port}"


def lab_urls(state: Path) -> dict[str, str]:
    """Each component's address in the lab of this state directory (its lab.json), else the
    documented one."""
    meta = Path(state) / "lab.json"
    recorded = read_json(meta, "the lab's record").get("urls") if meta.exists() else None
    defaults = {name: url(port) for name, port in DEFAULT_PORTS.items()}
    return {**defaults, **recorded} if isinstance(recorded, dict) else defaults


def lab_url(state: Path, component: str) -> str:
    """One component's address in the lab of this state directory: lab_urls(state)[component]."""
    return lab_urls(state)[component]


# The names a browser or a local client uses for this machine's loopback.
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
WILDCARDS = ("", "0.0.0.0", "::", "[::]")


def served_hosts(host: str, port: int, names: tuple[str, ...] | list[str] = ()) -> frozenset[str]:
    """The host names a server bound to host:port answers as Host: its loopback names, the
    address it is bound to (unless a wildcard), and `names` (compose's or a cluster's service
    name). Any port: a port-forward or a published port may differ from the one bound.

    Anything else is a name someone else chose: a DNS-rebinding page in the learner's browser
    (`rebind.attacker.example` resolved to 127.0.0.1) sends its own name as Host, and is refused.

        >>> sorted(served_hosts("127.0.0.1", 9096))
        ['127.0.0.1', '[::1]', 'localhost']
    """
    bound = () if host in WILDCARDS else (f"[{host}]" if ":" in host and not host.startswith("[") else host,)
    return frozenset(name.lower() for name in (*LOOPBACK_NAMES, *bound, *names))


def host_allowed(header: str | None, allowed: frozenset[str]) -> bool:
    """Whether a request's Host header names one of the served hosts, on any port (an absent one does not)."""
    if header is None:
        return False
    name = header.strip().lower()
    if name.startswith("["):  # [::1]:9096
        name = name[: name.find("]") + 1] if "]" in name else name
    else:
        name = name.rsplit(":", 1)[0] if name.count(":") == 1 else name
    return name in allowed
