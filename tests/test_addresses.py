"""Where a lab's components listen (runwatch.core.addresses): `--ports` as typed, and lab.json as
`runwatch up` records it, read back by every command that talks to the lab."""

from __future__ import annotations

import json

import pytest

from runwatch.core.addresses import DEFAULT_PORTS, lab_url, lab_urls, parse_ports
from runwatch.core.command import UsageError
from runwatch.core.names import PORTS, url
from runwatch.lab.render import loopback
from runwatch.lab.start import choose_ports


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


def _lab_over(tmp_path, alertmanager_yml: str):
    from runwatch.lab.supervise import Lab

    root = tmp_path / "root"
    (root / "alertmanager").mkdir(parents=True)
    (root / "prometheus").mkdir()
    (root / "alertmanager" / "alertmanager.yml").write_text(alertmanager_yml)
    lab = Lab(tmp_path / "state", root)
    lab.ports = {**DEFAULT_PORTS, "pager": 40000}
    return lab


def test_the_served_alertmanager_config_gives_the_lab_s_token_to_the_pager_s_webhooks_only(tmp_path):
    """Issue 28: the native pager takes a webhook only with the lab's token, which Alertmanager
    reads from the file the served config names; a webhook elsewhere gets nothing of it."""
    import yaml

    from runwatch.core.paths import REPO

    elsewhere = "receivers:\n  - name: elsewhere\n    webhook_configs:\n      - url: http://example.invalid:9000/hook\n"
    source = (REPO / "alertmanager" / "alertmanager.yml").read_text()
    lab = _lab_over(tmp_path, source.replace("receivers:\n", elsewhere))
    lab.render_alertmanager_config()
    token = lab.pager_token
    assert token.stat().st_mode & 0o777 == 0o600 and len(token.read_text().strip()) >= 32
    served = yaml.safe_load(lab.alertmanager_yml.read_text())
    hooks = {h["url"]: h for r in served["receivers"] for h in r.get("webhook_configs", [])}
    assert set(hooks) == {"http://127.0.0.1:40000/webhook", "http://127.0.0.1:40000/watchdog",
                          "http://example.invalid:9000/hook"}  # fmt: skip
    auth = {"type": "Bearer", "credentials_file": str(token)}
    assert all(h["http_config"]["authorization"] == auth for u, h in hooks.items() if ":40000/" in u)
    assert "http_config" not in hooks["http://example.invalid:9000/hook"]
    before = token.read_text()
    lab.render_alertmanager_config()  # a reload renders again: the token stays the pager's
    assert token.read_text() == before


@pytest.mark.parametrize(
    "text, says",
    [("route: [\n", "line 2: not YAML"), ("- a list\n", "not an Alertmanager"),
     ("route: &r {receiver: a}\nagain: *r\n", "line 2: an alias")],  # issue 40: no alias bomb
)  # fmt: skip
def test_an_alertmanager_yml_that_is_not_a_config_is_one_line_naming_it(tmp_path, text, says):
    lab = _lab_over(tmp_path, text)
    with pytest.raises(UsageError, match=f"alertmanager.yml:? ?.*{says}") as err:
        lab.render_alertmanager_config()
    assert "\n" not in str(err.value) and not lab.alertmanager_yml.exists()
