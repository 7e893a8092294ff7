"""Small pieces of the process and port handling."""

import socket
import subprocess
import sys

import pytest
import requests
from prometheus_client import CollectorRegistry

from runwatch.exporter.server import start
from runwatch.prom import server as promserver
from runwatch.prom.server import free_port, listens, port_is_free, wait_ready


def test_a_listening_port_is_busy_and_a_closed_one_is_free_despite_time_wait():
    port = free_port()
    srv = start(CollectorRegistry(), port)
    assert not port_is_free(port)
    with socket.create_connection(("127.0.0.1", port)) as c:  # leaves the server side in TIME_WAIT
        c.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        while c.recv(65536):
            pass
    srv.shutdown()
    srv.server_close()
    assert port_is_free(port)


def _strict_bind(port: int) -> OSError | None:
    """What a bind with no SO_REUSEADDR (another picker's) gets on port."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as err:
            return err
    return None


@pytest.mark.integration
def test_a_picked_port_is_held_from_other_pickers_until_its_server_listens_on_it():
    port = free_port()
    assert isinstance(_strict_bind(port), OSError)  # another picker's bind is refused
    taken = set()
    for _ in range(2000):  # nor does the kernel hand it to a bind(0)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            taken.add(s.getsockname()[1])
    assert port not in taken
    server = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        assert wait_ready(f"http://127.0.0.1:{port}/", 30, server)  # SO_REUSEADDR: its server may bind it
        assert listens(server.pid, port) and not port_is_free(port)
        assert port not in promserver._HELD  # no longer held once its server listens on it
    finally:
        server.terminate()
        server.wait()


@pytest.mark.integration
def test_another_server_answering_on_the_port_is_not_the_process_ready():
    """The CI failure: a server of another test took a lab's console port before the console
    bound it and answered the lab's readiness probe; the console then exited, 'already in use'."""
    other = start(CollectorRegistry(), 0)  # answers 200 on every path
    port = other.server_address[1]
    late = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # never listens
    try:
        assert requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).status_code == 200
        assert not wait_ready(f"http://127.0.0.1:{port}/metrics", 2, late)
        late.kill()
        late.wait()
        assert not wait_ready(f"http://127.0.0.1:{port}/metrics", 30, late)  # exited: at once
    finally:
        other.shutdown()
        other.server_close()
        if late.poll() is None:
            late.kill()
