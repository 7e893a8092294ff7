"""The native lab's processes: what `runwatch up` starts, in which order, with which configuration,
and how `down` finds and stops them again. `runwatch up | down | status | reload` (lab.py) and
`runwatch drill` (which starts a lab whose incident is hidden) both use it.

Everything a lab keeps lives in one state directory (default ./.runwatch): Prometheus's TSDB,
Alertmanager's silences, the page log, each run's run.json, logs and PID files. So `down` then
`up` keeps Prometheus's history. Prometheus reads prometheus/prometheus.yml and its rules through
symlinks in the state directory, beside a targets/ folder of loopback addresses, and
Alertmanager reads alertmanager/alertmanager.yml with each compose service name (`pager`) replaced
by 127.0.0.1 (`loopback`). Those are the places where the native lab differs from docker compose.

It takes the documented ports unless `up --ports` moves them (`--ports free`: all, to free ports);
it records where each component listens in its lab.json (runwatch.core.addresses), where every
command that talks to it looks. So labs in different state directories run side by side.

Its parts, one module each: the state directory's paths and ports (state.py), the configuration
it renders and the targets it writes (render.py), a drill's sealed answer (seal.py), each
component's command line (argv.py), its processes and PID files (processes.py) and the state
directory's locks (locks.py). `runwatch up` itself is up.py.
"""

from __future__ import annotations

from runwatch.lab.argv import Argv
from runwatch.lab.locks import Locks
from runwatch.lab.processes import Processes
from runwatch.lab.render import Configuration
from runwatch.lab.seal import Sealing


class Lab(Configuration, Sealing, Argv, Processes, Locks):
    """One lab's state directory and the components it runs.

    >>> lab = Lab(Path(".runwatch"))
    >>> lab.records()  # each component's PID file
    """
