"""Small pieces of the process and port handling."""

import socket

from prometheus_client import CollectorRegistry

from runwatch.exporter.server import start
from runwatch.prom.server import free_port, port_is_free


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
