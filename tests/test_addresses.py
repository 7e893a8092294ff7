"""Where a lab's components listen (runwatch.core.addresses): `--ports` as typed, and lab.json as
`runwatch up` records it, read back by every command that talks to the lab."""

from __future__ import annotations

import json

import pytest

from runwatch.core.addresses import DEFAULT_PORTS, lab_url, lab_urls, parse_ports
from runwatch.core.command import UsageError
from runwatch.core.names import PORTS, url
from runwatch.lab.supervise import choose_ports, loopback


def test_free_moves_every_component_and_names_move_only_themselves():
    assert parse_ports("free") == dict.fromkeys(DEFAULT_PORTS, 0)
    assert parse_ports("prometheus=19090,pager=0") == {"prometheus": 19090, "pager": 0}
    ports = choose_ports({"prometheus": 19090, "pager": 0}, ranks=1)
    assert ports["prometheus"] == 19090 and ports["pager"] not in (0, PORTS["pager"])
    assert {k: v for k, v in ports.items() if k not in ("prometheus", "pager")} == {
        k: v for k, v in DEFAULT_PORTS.items() if k not in ("prometheus", "pager")
    }


@pytest.mark.parametrize("text", ["grafana=3000", "prometheus=x", "prometheus=70000", "prometheus", ""])
def test_a_bad_ports_flag_names_the_flag(text):
    with pytest.raises(UsageError, match="^--ports: "):
        parse_ports(text)


def test_a_state_dir_without_a_lab_means_the_documented_ports(tmp_path):
    assert lab_urls(tmp_path) == {name: f"http://127.0.0.1:{port}" for name, port in DEFAULT_PORTS.items()}
    assert lab_url(tmp_path, "prometheus") == url("prometheus")


def test_the_recorded_urls_are_the_lab_s(tmp_path):
    (tmp_path / "lab.json").write_text(json.dumps({"run_id": "r", "urls": {"prometheus": "http://127.0.0.1:1"}}))
    assert lab_url(tmp_path, "prometheus") == "http://127.0.0.1:1"
    assert lab_url(tmp_path, "pager") == url("pager")  # one it does not name: the documented one


def test_the_webhook_to_the_pager_follows_its_port():
    config = "url: http://pager:9095/webhook\\n"
    assert loopback(config) == "url: http://127.0.0.1:9095/webhook\\n"
    assert loopback(config, {**PORTS, "pager": 40000}) == "url: http://127.0.0.1:40000/webhook\\n"
