"""The native lab's Prometheus and Alertmanager answer only the lab: a web page of another origin,
in a real browser (Debian's chromium), cannot silence, reload, quit or query them (issue 40, N19
and N20). The same requests from the command line, with the lab's password where Alertmanager
asks it, still work.

What holds them: Prometheus runs without --web.enable-lifecycle (`runwatch reload` sends SIGHUP)
and answers CORS for its own origin only; Alertmanager, whose CORS is `*` with no flag to narrow
it, asks every request for the lab's password (runwatch.core.credentials).
"""

from __future__ import annotations

import pytest
import requests

from runwatch.core import credentials
from tests.conftest import metric

pytestmark = pytest.mark.e2e

# What a hostile page tries, each with fetch(): the JSON silence of N19 (a CORS request, so a
# preflight first), the same as a "simple" text/plain POST, both servers' /-/reload, a query whose
# answer it wants to read, and the text/plain POST /-/quit of N20, last.
ATTACKS = """async ({am, prom}) => {
  const silence = JSON.stringify({matchers: [{name: "alertname", value: ".+", isRegex: true, isEqual: true}],
    startsAt: new Date().toISOString(), endsAt: new Date(Date.now() + 3600e3).toISOString(),
    createdBy: "evil.example", comment: "shh"});
  const tried = {};
  const attempt = async (name, url, init) => {
    try {
      const resp = await fetch(url, init);
      tried[name] = resp.type === "opaque" ? "sent, unread" : resp.status;
    } catch (err) {
      tried[name] = "refused";
    }
  };
  await attempt("silence", am + "/api/v2/silences",
    {method: "POST", headers: {"Content-Type": "application/json"}, body: silence});
  await attempt("silence as text", am + "/api/v2/silences",
    {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body: silence});
  await attempt("alertmanager reload", am + "/-/reload", {method: "POST", mode: "no-cors"});
  await attempt("prometheus reload", prom + "/-/reload", {method: "POST", mode: "no-cors"});
  await attempt("query", prom + "/api/v1/query?query=up", {});
  await attempt("quit", prom + "/-/quit", {method: "POST", headers: {"Content-Type": "text/plain"}, body: "x"});
  return tried;
}"""


def reloads(lab) -> dict[str, float]:
    """When each server last reloaded its configuration, from its own metrics."""
    return {
        "prometheus": metric(lab.url("prometheus"), "prometheus_config_last_reload_success_timestamp_seconds"),
        "alertmanager": metric(
            lab.url("alertmanager"),
            "alertmanager_config_last_reload_success_timestamp_seconds",
            auth=credentials.basic_auth(lab.state),
        ),
    }


def test_a_page_of_another_origin_cannot_silence_reload_quit_or_query(lab_factory, tab, evil_origin):
    lab = lab_factory().wait()
    am, prom = lab.url("alertmanager"), lab.url("prometheus")
    auth = credentials.basic_auth(lab.state)
    before = reloads(lab)
    tab.goto(evil_origin)
    tried = tab.evaluate(ATTACKS, {"am": am, "prom": prom})
    # The browser read nothing and the servers did nothing: no silence, no reload, still running.
    assert tried["silence"] == "refused" and tried["query"] == "refused" and tried["quit"] == "refused", tried
    assert requests.get(f"{am}/api/v2/silences", timeout=5, auth=auth).json() == []
    assert reloads(lab) == before
    assert lab.alive(lab.records()["prometheus"])
    assert requests.get(f"{prom}/api/v1/query", params={"query": "up"}, timeout=5).json()["status"] == "success"


def test_the_command_line_still_reaches_both_apis(lab_factory):
    """A learner's curl and amtool: Prometheus as before, Alertmanager with the lab's password
    (state/alertmanager/password, or amtool --http.config.file=state/alertmanager/http.yml)."""
    import subprocess

    from runwatch.prom.tools import binary

    lab = lab_factory().wait()
    am = lab.url("alertmanager")
    assert requests.get(f"{am}/api/v2/status", timeout=5).status_code == 401
    assert requests.get(f"{am}/api/v2/status", timeout=5, auth=credentials.basic_auth(lab.state)).ok
    amtool = [binary("amtool"), f"--alertmanager.url={am}", f"--http.config.file={credentials.http_config(lab.state)}"]
    added = subprocess.run([*amtool, "silence", "add", "alertname=Nothing", "--comment=from amtool", "--duration=1m"],
                           capture_output=True, text=True, timeout=30)  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert requests.get(f"{lab.url('prometheus')}/api/v1/query", params={"query": "up"}, timeout=5).ok


def test_reload_by_signal_puts_an_edited_prometheus_yml_in_force(lab_factory):
    """The lab serves a rendered prometheus.yml (with the Alertmanager password), no longer a
    link to the learner's file: `runwatch reload` renders an edit of it again, then SIGHUPs."""
    from tests.conftest import edit, keep_unit_tests, runwatch

    lab = lab_factory().wait()
    keep_unit_tests(lab.layout.root, two_runs=(), baselines=())  # reload's checks run; their subject is elsewhere
    edit(
        lab.layout.prometheus_yml,
        "  evaluation_interval: 1s\n",
        "  evaluation_interval: 1s\n  external_labels: {lab: edited}\n",
    )
    res = runwatch("reload", "--state-dir", str(lab.state), cwd=lab.cwd)
    assert res.returncode == 0 and "reloaded prometheus" in res.stdout, res.stdout + res.stderr
    config = requests.get(f"{lab.url('prometheus')}/api/v1/status/config", timeout=5).json()["data"]["yaml"]
    assert "lab: edited" in config
    assert "password_file" in config  # still the password on its way to Alertmanager
