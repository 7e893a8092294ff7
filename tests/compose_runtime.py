"""A real container engine for `docker-compose`: Docker where there is one, else Podman's Docker API.

Used by tests/test_compose_e2e.py (`make test-compose`) to run the repository's own
docker-compose.yml, unmodified, through Debian's docker-compose 1.29.

- Docker: used as it is when DOCKER_HOST is set or /var/run/docker.sock exists; the images are
  the official ones, pulled by compose.
- Podman (compose/podman/README.md says what is substituted and why): CONTAINERS_CONF points at
  compose/podman/containers.conf, compose/podman/build-images.sh builds the pinned images from
  Debian's packages, `podman system service` (a child of this process) serves the Docker API on
  a socket of our own, and a thread runs each container's healthcheck at its own interval,
  which podman leaves to systemd timers that do not exist here.

    >>> with Runtime(tmp_path, project="rw") as rt:
    ...     rt.compose("up", "-d", "trainer")
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

from runwatch.core.paths import REPO

PODMAN_DIR = REPO / "compose" / "podman"
DOCKER_SOCKET = Path("/var/run/docker.sock")


class EngineError(RuntimeError):
    """The container engine could not be set up; the message says what is missing."""


class Runtime:
    def __init__(self, workdir: Path, project: str):
        self.workdir, self.project = Path(workdir), project
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWATCH_")}
        self.engine = "docker" if (os.environ.get("DOCKER_HOST") or DOCKER_SOCKET.exists()) else "podman"
        self._service: subprocess.Popen | None = None
        self._stop = threading.Event()
        self._health: threading.Thread | None = None
        self.health_runs = 0  # healthchecks run by our thread (podman only)

    # --- set-up ---

    def __enter__(self) -> Runtime:
        for tool in ("docker-compose", self.engine):
            if shutil.which(tool) is None:
                raise EngineError(f"{tool} is not on PATH: `make test-compose` installs it (as root)")
        if self.engine == "podman":
            self._start_podman()
        return self

    def _start_podman(self) -> None:
        self.env["CONTAINERS_CONF"] = str(PODMAN_DIR / "containers.conf")
        build = subprocess.run(
            ["bash", str(PODMAN_DIR / "build-images.sh")], env=self.env, capture_output=True, text=True, timeout=900
        )
        if build.returncode != 0:
            raise EngineError(f"compose/podman/build-images.sh failed: {build.stderr.strip()[-800:]}")
        sock = self.workdir / "podman.sock"
        self._service_log = open(self.workdir / "podman-service.log", "wb")  # noqa: SIM115 (closed in __exit__)
        self._service = subprocess.Popen(
            ["podman", "system", "service", "--time=0", f"unix://{sock}"],
            env=self.env, stdout=self._service_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        self.env["DOCKER_HOST"] = f"unix://{sock}"
        deadline = time.monotonic() + 30
        while not sock.exists():
            if self._service.poll() is not None or time.monotonic() > deadline:
                raise EngineError(f"podman system service did not start; see {self.workdir / 'podman-service.log'}")
            time.sleep(0.1)
        self._health = threading.Thread(target=self._run_healthchecks, name="healthchecks", daemon=True)
        self._health.start()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._health is not None:
            self._health.join(timeout=30)
        if self._service is not None:
            self._service.terminate()
            try:
                self._service.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._service.kill()
                self._service.wait()
            self._service_log.close()

    # --- commands ---

    def compose(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 600
    ) -> subprocess.CompletedProcess:
        """docker-compose on the repository's own file, as a learner would run it from the checkout."""
        return subprocess.run(
            ["docker-compose", "-p", self.project, "-f", str(REPO / "docker-compose.yml"), *args],
            cwd=REPO, env={**self.env, **(env or {})}, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    def unpause(self, service: str) -> None:
        """`docker-compose unpause SERVICE`. On Podman, the engine's own: Podman 4.3's Docker API lists
        a paused container only with `all`, so docker-compose 1.29 finds none to unpause."""
        if self.engine == "docker":
            res = self.compose("unpause", service)
        else:
            res = self.engine_cli("unpause", f"{self.project}_{service}_1")
        if res.returncode != 0:
            raise EngineError(f"unpause {service}: {res.stdout}{res.stderr}")

    def engine_cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """The engine's own CLI (docker or podman), for what compose does not report."""
        return subprocess.run(
            [self.engine, *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )  # fmt: skip

    def left_behind(self) -> dict[str, list[str]]:
        """Containers, networks and volumes that still carry this project's label."""
        label = f"label=com.docker.compose.project={self.project}"
        out = {}
        for kind, args in [
            ("containers", ["ps", "-a", "--filter", label, "--format", "{{.Names}}"]),
            ("networks", ["network", "ls", "--filter", label, "--format", "{{.Name}}"]),
            ("volumes", ["volume", "ls", "--filter", label, "--format", "{{.Name}}"]),
        ]:
            res = self.engine_cli(*args)
            out[kind] = [line for line in res.stdout.split() if line] if res.returncode == 0 else [res.stderr.strip()]
        return out

    # --- podman's healthchecks, which would run from systemd timers ---

    def _containers(self) -> list[dict]:
        res = self.engine_cli(
            "ps", "--filter", f"label=com.docker.compose.project={self.project}", "--format", "json", timeout=30
        )
        return json.loads(res.stdout or "[]") if res.returncode == 0 else []

    def _run_healthchecks(self) -> None:
        due: dict[str, float] = {}  # container id -> monotonic time of its next check
        intervals: dict[str, float] = {}
        while not self._stop.wait(0.5):
            now = time.monotonic()
            for c in self._containers():
                cid = c["Id"]
                if cid not in intervals:
                    res = self.engine_cli("inspect", "--format", "{{json .Config.Healthcheck}}", cid, timeout=30)
                    check = json.loads(res.stdout or "null") if res.returncode == 0 else None
                    intervals[cid] = (check or {}).get("Interval", 0) / 1e9 if check and check.get("Test") else 0
                    due[cid] = now  # the first check at once, as the start period begins
                if intervals[cid] and now >= due[cid]:
                    due[cid] = now + intervals[cid]
                    self.engine_cli("healthcheck", "run", cid, timeout=30)
                    self.health_runs += 1
