"""Shared helpers: real binaries and free loopback ports."""

import shutil
import socket

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def need(binary: str) -> str:
    """The binary's path; fail (not skip) when it is missing: CI installs it."""
    path = shutil.which(binary)
    if path is None:
        pytest.fail(f"{binary} is not on PATH: apt-get install prometheus prometheus-alertmanager")
    return path
