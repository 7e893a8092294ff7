"""charts/runwatch, validated object by object without a cluster (docs/kubernetes.md).

`helm template` renders the chart for one rank and for four; every core object is checked
against Kubernetes 1.35's own schemas strictly (kubernetes-validate's, shipped in its package),
every custom resource against the Prometheus Operator's vendored CRD schema (charts/crds/, by
check-jsonschema); the PrometheusRules go through promtool and the repository's own promtool
tests unchanged; the dashboards must equal grafana/dashboards/ but for the datasource uid; and
the monitors' relabelings run on a real Prometheus scraping real rank exporters. Helm and
kubectl come from `make k8s-tools` (charts/fetch-k8s-tools.py).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest
import requests
import yaml

from runwatch.core.paths import REPO
from runwatch.exporter import server as exporter_server
from runwatch.exporter.metrics import TrainerMetrics
from runwatch.exporter.rank_metrics import LauncherMetrics, RankMetrics
from runwatch.prom.server import Process, free_port, instant, prometheus_argv
from runwatch.prom.tools import FETCHED
from runwatch.trainer.config import CLUSTER_INCIDENTS, INCIDENTS, MAX_RANKS, TrainConfig
from tests.conftest import edit, need, threshold, wait_for
from tests.crd_schema import json_schema, load_crd

CHART = REPO / "charts" / "runwatch"
CRDS = REPO / "charts" / "crds"
KUBERNETES = "1.35.0"  # kubectl's, and the oldest minor the chart is written for that kubernetes-validate ships
RELEASE = "rw"
NAMESPACE = "runwatch"
STACK = ("--set", "stack.release=kps")
FOUR = (*STACK, "--set", "trainer.ranks=4", "--set", "trainer.incident=straggler")
LAB_RUNBOOKS = "http://127.0.0.1:9095/runbooks"  # make_annotations.py's BASE_URL, which the promtool tests expect
FLEET = (*STACK, "--set", "fleet.enabled=true")
SHARDED = (*FLEET, "--set", "fleet.shards=2")
RENDERS = {"one rank": STACK, "four ranks": FOUR, "fleet of two shards": SHARDED}


def k8s_tool(name: str) -> str:
    path = FETCHED / name
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is missing: `make k8s-tools` installs helm and kubectl (charts/fetch-k8s-tools.py)")
    return str(path)


def helm(*args: str, chart: Path = CHART) -> subprocess.CompletedProcess:
    argv = [k8s_tool("helm"), *args]
    argv = [a if a != "CHART" else str(chart) for a in argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def render(*values: str, chart: Path = CHART) -> list[dict]:
    res = helm("template", RELEASE, "CHART", "--namespace", NAMESPACE, *values, chart=chart)
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {name: render(*values) for name, values in RENDERS.items()}


def of_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def is_custom(doc: dict) -> bool:
    return doc["apiVersion"].startswith("monitoring.coreos.com/")


# --- helm itself ---


@pytest.mark.integration
@pytest.mark.parametrize("render_name", RENDERS)
def test_helm_lint_passes_strictly(render_name):
    res = helm("lint", "CHART", "--strict", *RENDERS[render_name])
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.integration
def test_each_render_holds_every_object_the_lab_runs(rendered):
    """One rank: no rank or launcher monitor, no headless Service; four: both, and a Job of four pods."""
    kinds = {name: sorted(f"{d['kind']}/{d['metadata']['name']}" for d in docs) for name, docs in rendered.items()}
    common = {
        "AlertmanagerConfig/rw-runwatch", "Deployment/rw-runwatch-console", "Deployment/rw-runwatch-pager",
        "Job/rw-runwatch-trainer", "PersistentVolumeClaim/rw-runwatch-pages", "PodMonitor/rw-runwatch-trainer",
        "Service/rw-runwatch-console", "Service/rw-runwatch-pager", "ServiceMonitor/rw-runwatch-pager",
        "NetworkPolicy/rw-runwatch-pager", "NetworkPolicy/rw-runwatch-trainer", "Secret/rw-runwatch-pager-token",
        *(f"PrometheusRule/rw-runwatch-{f.stem}" for f in (REPO / "prometheus" / "rules").glob("*.yml")),
        *(f"ConfigMap/rw-runwatch-dashboard-{f.stem}" for f in (REPO / "grafana" / "dashboards").glob("*.json")),
    }  # fmt: skip
    cluster = {"PodMonitor/rw-runwatch-ranks", "PodMonitor/rw-runwatch-launcher", "Service/rw-runwatch-trainer"}
    assert set(kinds["one rank"]) == common
    assert set(kinds["four ranks"]) == common | cluster
    [job] = of_kind(rendered["four ranks"], "Job")
    assert (job["spec"]["completionMode"], job["spec"]["completions"], job["spec"]["parallelism"]) == ("Indexed", 4, 4)


@pytest.mark.integration
def test_helm_package_stores_the_files_the_symlinks_point_at(tmp_path):
    """files/rules, files/dashboards and files/alertmanager are symlinks into the lab's own folders:
    a packaged chart (what `helm install` from a repository reads) holds their content."""
    res = helm("package", "CHART", "--destination", str(tmp_path))
    assert res.returncode == 0, res.stderr
    [tgz] = tmp_path.glob("runwatch-*.tgz")
    with tarfile.open(tgz) as tar:
        members = {m.name: m for m in tar.getmembers()}
        pairs = {f"runwatch/files/rules/{f.name}": f for f in sorted((REPO / "prometheus" / "rules").glob("*.yml"))} | {
            f"runwatch/files/dashboards/{f.name}": f for f in sorted((REPO / "grafana" / "dashboards").glob("*.json"))
        }
        pairs["runwatch/files/alertmanager/alertmanager.yml"] = REPO / "alertmanager" / "alertmanager.yml"
        for name, source in pairs.items():
            assert members[name].isfile(), name
            assert tar.extractfile(members[name]).read() == source.read_bytes(), name


# --- every object against its schema ---


@pytest.mark.integration
@pytest.mark.parametrize("render_name", RENDERS)
def test_core_objects_pass_kubernetes_schemas_strictly(rendered, render_name):
    import kubernetes_validate

    core = [d for d in rendered[render_name] if not is_custom(d)]
    assert core
    for doc in core:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


@pytest.mark.integration
def test_strict_validation_refuses_a_field_kubernetes_does_not_know(rendered):
    """The check above can fail: a misspelt field in the pager's container is refused."""
    import kubernetes_validate

    [pager] = [d for d in rendered["one rank"] if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("pager")]
    bad = copy.deepcopy(pager)
    bad["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = bad["spec"]["template"]["spec"]["containers"][
        0
    ].pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(bad, KUBERNETES, strict=True)


@pytest.fixture(scope="module")
def crd_schemas(tmp_path_factory) -> dict[str, Path]:
    """kind -> the vendored CRD's schema as a JSON Schema file (tests/crd_schema.py)."""
    root = tmp_path_factory.mktemp("crd-schemas")
    out = {}
    for path in sorted(CRDS.glob("monitoring.coreos.com_*.yaml")):
        crd = load_crd(path.read_text())
        kind = crd["spec"]["names"]["kind"]
        out[kind] = root / f"{kind}.json"
        out[kind].write_text(json.dumps(json_schema(crd)))
    return out


def check_jsonschema(schema: Path, instances: list[Path]) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("check-jsonschema")
    argv = [str(exe), "--schemafile", str(schema), "--disable-formats", "*", *map(str, instances)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


# Each spoilt copy must fail its schema, naming the field: an unknown field, a malformed
# duration, a number for a string. Checked in the same check-jsonschema run as the rendered ones.
SPOILT = {
    "PodMonitor": (lambda d: d["spec"]["podMetricsEndpoints"][0].update(relabellings=[]), "relabellings"),
    "PrometheusRule": (lambda d: d["spec"]["groups"][0].update(interval="one second"), "interval"),
    "AlertmanagerConfig": (lambda d: d["spec"]["route"].update(groupWait=5), "groupWait"),
    "ServiceMonitor": (lambda d: d["spec"]["endpoints"][0].update(port=9095), "port"),
    "PrometheusAgent": (lambda d: d["spec"].update(shards="two"), "shards"),
}


@pytest.mark.integration
def test_custom_resources_pass_their_crd_schemas_and_spoilt_ones_fail(rendered, crd_schemas, tmp_path):
    """Every PrometheusRule, PodMonitor, ServiceMonitor, AlertmanagerConfig and PrometheusAgent of the renders,
    by check-jsonschema against the operator's own schema (v0.93.0), one run a kind; in the same
    run a spoilt copy of each fails, naming what is wrong."""
    by_kind: dict[str, list[Path]] = {}
    for render_name, docs in rendered.items():
        for n, doc in enumerate(d for d in docs if is_custom(d)):
            assert doc["kind"] in crd_schemas, f"{doc['kind']}: no vendored CRD in charts/crds/"
            path = tmp_path / f"{render_name.replace(' ', '-')}-{n}-{doc['kind']}.json"
            path.write_text(json.dumps(doc))
            by_kind.setdefault(doc["kind"], []).append(path)
    assert set(by_kind) == set(crd_schemas) == set(SPOILT)
    for kind, paths in by_kind.items():
        spoil, says = SPOILT[kind]
        doc = json.loads(paths[0].read_text())
        spoil(doc)
        (tmp_path / f"spoilt-{kind}.json").write_text(json.dumps(doc))
        res = check_jsonschema(crd_schemas[kind], [*paths, tmp_path / f"spoilt-{kind}.json"])
        failing = {line.split("::")[0].strip() for line in res.stdout.splitlines() if "::" in line}
        assert res.returncode == 1 and failing == {str(tmp_path / f"spoilt-{kind}.json")}, res.stdout + res.stderr
        assert says in res.stdout, res.stdout


# --- the rules: the lab's own, through promtool ---


def rule_specs(docs: list[dict]) -> dict[str, dict]:
    """prometheus/rules/<file> -> the spec of the PrometheusRule rendered from it."""
    return {d["metadata"]["annotations"]["runwatch/source"]: d["spec"] for d in of_kind(docs, "PrometheusRule")}


@pytest.mark.integration
def test_the_rendered_rules_are_the_rule_files_and_promtool_accepts_them(tmp_path):
    """With the lab's runbook URL the specs are the rule files, group for group, and written out
    `promtool check rules` accepts them. Being the rule files, they pass every unit test of
    prometheus/tests/ as the rule files do (test_check runs them all on the repository)."""
    specs = rule_specs(render(*STACK, "--set", f"runbookBaseURL={LAB_RUNBOOKS}"))
    sources = sorted((REPO / "prometheus" / "rules").glob("*.yml"))
    assert sorted(specs) == [f"prometheus/rules/{f.name}" for f in sources]
    (tmp_path / "rules").mkdir()
    for f in sources:
        assert specs[f"prometheus/rules/{f.name}"] == yaml.safe_load(f.read_text()), f.name
        (tmp_path / "rules" / f.name).write_text(yaml.safe_dump(specs[f"prometheus/rules/{f.name}"], sort_keys=False))
    promtool = need("promtool")
    res = subprocess.run([promtool, "check", "rules", *sorted((tmp_path / "rules").glob("*.yml"))],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr


def runbook_urls(docs: list[dict]) -> dict[str, str]:
    return {
        r["alert"]: r["annotations"]["runbook_url"]
        for spec in rule_specs(docs).values()
        for g in spec["groups"]
        for r in g["rules"]
        if "alert" in r
    }


@pytest.mark.integration
def test_runbook_links_point_at_the_pager_in_the_cluster_or_where_set(rendered):
    urls = runbook_urls(rendered["one rank"])
    assert len(urls) >= 15
    for alert, url in urls.items():
        assert url == f"http://rw-runwatch-pager.{NAMESPACE}.svc:9095/runbooks/{alert}.md"
    external = runbook_urls(render(*STACK, "--set", "runbookBaseURL=https://oncall.example.org/runbooks/"))
    assert external == {a: f"https://oncall.example.org/runbooks/{a}.md" for a in urls}


@pytest.mark.integration
def test_a_threshold_edited_in_prometheus_rules_is_what_the_chart_renders(tmp_path):
    """A learner moves HeldOutGap's threshold in prometheus/rules/alerts.yml, nothing else: the
    chart's PrometheusRule says the new number (a copy of the checkout's chart and its sources,
    symlinks kept as they are)."""
    for d in ("prometheus", "alertmanager", "grafana"):
        shutil.copytree(REPO / d, tmp_path / d, symlinks=True)
    shutil.copytree(CHART, tmp_path / "charts" / "runwatch", symlinks=True)
    edit(tmp_path / "prometheus" / "rules" / "alerts.yml", threshold("HeldOutGap", "2"), threshold("HeldOutGap", "1.5"))

    def held_out_gap(docs: list[dict]) -> str:
        [spec] = [s for name, s in rule_specs(docs).items() if name.endswith("alerts.yml")]
        rules = [r for g in spec["groups"] for r in g["rules"]]
        [rule] = [r for r in rules if r.get("labels", {}).get("alertname") == "HeldOutGap" and "record" in r]
        return rule["expr"]

    assert held_out_gap(render(*STACK)) == "vector(2)"
    assert held_out_gap(render(*STACK, chart=tmp_path / "charts" / "runwatch")) == "vector(1.5)"


# --- the dashboards and the Alertmanager routes: the lab's own ---


def with_datasource(node, uid: str):
    """A dashboard with every Prometheus datasource reference's uid set to uid."""
    if isinstance(node, dict):
        out = {k: with_datasource(v, uid) for k, v in node.items()}
        if node.get("type") == "prometheus" and node.get("uid") == "runwatch-prometheus":
            out["uid"] = uid
        return out
    if isinstance(node, list):
        return [with_datasource(v, uid) for v in node]
    return node


@pytest.mark.integration
@pytest.mark.parametrize("uid", ["prometheus", "my-thanos"])
def test_the_dashboards_are_the_lab_s_but_for_the_datasource_uid(uid):
    docs = render(*STACK, "--set", f"dashboards.datasourceUid={uid}", "--set", "dashboards.folder=Training")
    maps = of_kind(docs, "ConfigMap")
    sources = sorted((REPO / "grafana" / "dashboards").glob("*.json"))
    assert len(maps) == len(sources)
    by_file = {name: json.loads(text) for m in maps for name, text in m["data"].items()}
    assert sorted(by_file) == [f.name for f in sources]
    for f in sources:
        lab = json.loads(f.read_text())
        assert json.dumps(lab).count('"runwatch-prometheus"') > 0
        assert by_file[f.name] == with_datasource(lab, uid), f.name
        assert '"runwatch-prometheus"' not in json.dumps(by_file[f.name])
    for m in maps:
        assert m["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert m["metadata"]["annotations"]["grafana_folder"] == "Training"


def matcher_text(m: dict) -> str:
    return f'{m["name"]}{m["matchType"]}"{m["value"]}"'


def lab_route(route: dict) -> dict:
    """An AlertmanagerConfig route in alertmanager.yml's own words."""
    names = {"groupBy": "group_by", "groupWait": "group_wait", "groupInterval": "group_interval",
             "repeatInterval": "repeat_interval", "receiver": "receiver", "continue": "continue"}  # fmt: skip
    out = {names[k]: v for k, v in route.items() if k in names}
    if "matchers" in route:
        out["matchers"] = [matcher_text(m) for m in route["matchers"]]
    if "routes" in route:
        out["routes"] = [lab_route(r) for r in route["routes"]]
    assert set(route) <= set(names) | {"matchers", "routes"}, route
    return out


@pytest.mark.integration
def test_the_alertmanager_config_routes_inhibits_and_times_as_the_lab_does(rendered):
    """Read back into alertmanager.yml's form, the AlertmanagerConfig is alertmanager/alertmanager.yml,
    but for the webhooks' host: the pager's Service."""
    lab = yaml.safe_load((REPO / "alertmanager" / "alertmanager.yml").read_text())
    [amc] = of_kind(rendered["one rank"], "AlertmanagerConfig")
    assert amc["metadata"]["labels"]["release"] == "kps"
    spec = amc["spec"]
    assert lab_route(spec["route"]) == lab["route"]
    pager = f"http://rw-runwatch-pager.{NAMESPACE}.svc:9095"
    assert [
        {"name": r["name"], "webhook_configs": [{"url": w["url"], "send_resolved": w["sendResolved"]}
                                                for w in r["webhookConfigs"]]}
        for r in spec["receivers"]
    ] == [
        {**r, "webhook_configs": [{**w, "url": w["url"].replace("http://pager:9095", pager)}
                                  for w in r["webhook_configs"]]}
        for r in lab["receivers"]
    ]  # fmt: skip
    assert [
        {"source_matchers": [matcher_text(m) for m in i["sourceMatch"]],
         "target_matchers": [matcher_text(m) for m in i["targetMatch"]], "equal": i["equal"]}
        for i in spec["inhibitRules"]
    ] == lab["inhibit_rules"]  # fmt: skip


# --- the stack's release label ---


@pytest.mark.integration
def test_every_object_the_stack_selects_carries_its_release_label(rendered):
    """kube-prometheus-stack's Prometheus and Alertmanager select by release: <its release>; an
    object without it is silently ignored."""
    for docs in rendered.values():
        for doc in docs:
            if is_custom(doc) and not scraped_by_the_agent(doc) and doc["kind"] != "PrometheusAgent":
                assert doc["metadata"]["labels"]["release"] == "kps", doc["metadata"]["name"]


def scraped_by_the_agent(doc: dict) -> bool:
    return "runwatch/scraped-by" in doc["metadata"]["labels"]


# --- a cluster's nodes: the fleet's monitors, the operator's shards ---


def fleet_monitors(docs: list[dict]) -> list[dict]:
    return [d for d in docs if d["kind"] in ("PodMonitor", "ServiceMonitor") and "-fleet-" in d["metadata"]["name"]]


def endpoint(monitor: dict) -> dict:
    [ep] = monitor["spec"]["podMetricsEndpoints" if monitor["kind"] == "PodMonitor" else "endpoints"]
    return ep


def group_intervals(docs: list[dict]) -> dict[str, str]:
    return {g["name"]: g["interval"] for spec in rule_specs(docs).values() for g in spec["groups"]}


@pytest.mark.integration
def test_the_fleet_is_off_by_default(rendered):
    """The lab's renders hold no node monitor or agent, and cluster.yml keeps the lab's 1 s."""
    for name in ("one rank", "four ranks"):
        assert not fleet_monitors(rendered[name]) and not of_kind(rendered[name], "PrometheusAgent")
        assert group_intervals(rendered[name])["runwatch-cluster"] == "1s"


@pytest.mark.integration
def test_a_fleet_of_one_shard_is_scraped_by_the_stack_s_prometheus_every_5s():
    """fleet.enabled: one monitor a node-level exporter, each carrying the stack's release label
    (its Prometheus scrapes them), relabelled to the job the rules select by, at 5 s; cluster.yml's
    1 s groups are evaluated every 5 s, its 30 s group and every other file as they are."""
    docs, lab = render(*FLEET), render(*STACK)
    monitors = {m["metadata"]["name"]: m for m in fleet_monitors(docs)}
    assert sorted((m["kind"], n) for n, m in monitors.items()) == [
        ("PodMonitor", "rw-runwatch-fleet-ranks"), ("ServiceMonitor", "rw-runwatch-fleet-dcgm")]  # fmt: skip
    assert not of_kind(docs, "PrometheusAgent")
    for m in monitors.values():
        ep = endpoint(m)
        assert m["metadata"]["labels"]["release"] == "kps" and not scraped_by_the_agent(m)
        assert (ep["interval"], ep["scrapeTimeout"], ep.get("honorLabels", False)) == ("5s", "5s", False)
        targets = {r["targetLabel"]: r.get("sourceLabels", r.get("replacement")) for r in ep["relabelings"]}
        assert targets["node"] == ["__meta_kubernetes_pod_node_name"]
        assert targets["run_id"] == ["__meta_kubernetes_pod_label_runwatch_run_id"]
    assert endpoint(monitors["rw-runwatch-fleet-ranks"])["relabelings"][0] == {
        "action": "replace", "replacement": "nodes", "targetLabel": "job"}  # fmt: skip
    assert monitors["rw-runwatch-fleet-dcgm"]["spec"]["namespaceSelector"] == {"matchNames": ["gpu-operator"]}
    intervals, lab_intervals = group_intervals(docs), group_intervals(lab)
    changed = {g: (lab_intervals[g], i) for g, i in intervals.items() if i != lab_intervals[g]}
    assert changed and all(old == "1s" and new == "5s" for old, new in changed.values()), changed
    cluster = {g["name"] for g in rule_specs(lab)["prometheus/rules/cluster.yml"]["groups"]}
    assert set(changed) == {g for g in cluster if lab_intervals[g] == "1s"}
    assert intervals["runwatch-cluster-10m"] == "30s"


@pytest.mark.integration
def test_a_sharded_fleet_is_scraped_by_the_operator_s_shards_writing_to_the_stack(rendered):
    """fleet.shards=2: a PrometheusAgent of two shards selects the node monitors, which lose the
    release label (the stack's Prometheus scraping them too would double every series), and
    remote-writes to the stack's Prometheus, which still gets the rules."""
    docs = rendered["fleet of two shards"]
    [agent] = of_kind(docs, "PrometheusAgent")
    spec = agent["spec"]
    assert (spec["shards"], spec["scrapeInterval"]) == (2, "5s")
    assert spec["remoteWrite"] == [{"url": "http://kps-kube-prometheus-stack-prometheus.monitoring.svc:9090/api/v1/write",
                                    "queueConfig": {"batchSendDeadline": "1s"}}]  # fmt: skip
    assert spec["serviceAccountName"] == "kps-kube-prometheus-stack-prometheus"
    monitors = fleet_monitors(docs)
    assert len(monitors) == 2
    for m in monitors:
        selector = spec[f"{m['kind'][0].lower()}{m['kind'][1:]}Selector"]["matchLabels"]
        assert selector.items() <= m["metadata"]["labels"].items(), m["metadata"]["name"]
        assert "release" not in m["metadata"]["labels"]
    assert all(r["metadata"]["labels"]["release"] == "kps" for r in of_kind(docs, "PrometheusRule"))
    assert group_intervals(docs)["runwatch-cluster"] == "5s"


@pytest.mark.integration
def test_the_fleet_s_rules_pass_promtool_and_the_5s_tests(tmp_path):
    """cluster.yml as the fleet renders it (every 5 s) passes `promtool check rules` and
    prometheus/tests/cluster_5s.test.yml, written at a 5 s scrape."""
    spec = rule_specs(render(*FLEET, "--set", f"runbookBaseURL={LAB_RUNBOOKS}"))["prometheus/rules/cluster.yml"]
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "cluster.yml").write_text(yaml.safe_dump(spec, sort_keys=False))
    promtool = need("promtool")
    res = subprocess.run([promtool, "check", "rules", str(tmp_path / "rules" / "cluster.yml")],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    (tmp_path / "tests").mkdir()
    shutil.copy(REPO / "prometheus" / "tests" / "cluster_5s.test.yml", tmp_path / "tests")
    res = subprocess.run([promtool, "test", "rules", "cluster_5s.test.yml"], cwd=tmp_path / "tests",
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0 and "SUCCESS" in res.stdout, res.stdout[-3000:] + res.stderr[-3000:]


# --- bad values: one clear line each ---


@pytest.mark.integration
@pytest.mark.parametrize(
    "values, says",
    [
        ((), "stack.release: the kube-prometheus-stack release name is required"),
        ((*STACK, "--set", "trainer.ranks=3"), "trainer.ranks: 3 does not divide the batch of 64"),
        ((*STACK, "--set", "trainer.ranks=32"), "at '/trainer/ranks': maximum: got 32, want 16"),
        ((*STACK, "--set", "trainer.incident=bit_flip"), "at '/trainer/incident': value must be one of 'none'"),
        ((*STACK, "--set", "trainer.incident=hang"), "trainer.incident: hang is a cluster incident"),
        ((*STACK, "--set", "trainer.ranks=2", "--set", "trainer.precision=fp16"), "trainer.precision: a run over"),
        ((*STACK, "--set", "stack.release=Kube_Stack"), "at '/stack/release'"),
        ((*STACK, "--set", "trainer.seeds=3"), "additional properties 'seeds' not allowed"),
        ((*FLEET, "--set", "fleet.shards=0"), "at '/fleet/shards': minimum: got 0, want 1"),
        ((*FLEET, "--set", "fleet.monitors[0].kind=Probe"), "at '/fleet/monitors/0/kind'"),
        ((*FLEET, "--set", "fleet.scrapeInterval=5"), "at '/fleet/scrapeInterval'"),
    ],
)
def test_bad_values_are_refused_with_a_line_naming_the_field(values, says):
    res = helm("template", RELEASE, "CHART", *values)
    assert res.returncode == 1
    assert says in res.stderr, res.stderr
    assert res.stdout == "", "nothing rendered"


@pytest.mark.integration
@pytest.mark.parametrize(
    "old, new, says",
    [
        ("  repeat_interval: 1h\n", "  repeat_interval: 1h\n  active_time_intervals: [office]\n",
         "alertmanager/alertmanager.yml: route field active_time_intervals: the chart does not translate it"),
        ("""['severity="warning"']""", "['severity~warning']",
         'alertmanager/alertmanager.yml: matcher "severity~warning": expected name="value"'),
    ],
)  # fmt: skip
def test_an_alertmanager_yml_the_chart_cannot_translate_is_refused_naming_what(tmp_path, old, new, says):
    """The AlertmanagerConfig is read from the lab's file: what it cannot say in the CRD's words
    stops the render with a line naming it, rather than being left out."""
    for d in ("prometheus", "alertmanager", "grafana"):
        shutil.copytree(REPO / d, tmp_path / d, symlinks=True)
    shutil.copytree(CHART, tmp_path / "charts" / "runwatch", symlinks=True)
    edit(tmp_path / "alertmanager" / "alertmanager.yml", old, new, count=1)
    res = helm("template", RELEASE, "CHART", *STACK, chart=tmp_path / "charts" / "runwatch")
    assert res.returncode == 1 and says in res.stderr, res.stderr
    assert res.stdout == ""


def test_the_chart_s_copies_of_the_trainer_s_limits_agree_with_it():
    """The schema's incidents and rank limit, and the template's batch, are the trainer's."""
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["trainer"]["properties"]
    assert schema["incident"]["enum"] == [*INCIDENTS, *CLUSTER_INCIDENTS]
    assert schema["ranks"]["maximum"] == MAX_RANKS
    template = (CHART / "templates" / "trainer.yaml").read_text()
    assert re.search(r"\$batch := (\d+)", template)[1] == str(TrainConfig().batch_size)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["trainer"]["incident"] in INCIDENTS and values["stack"]["release"] == ""


# --- the relabelings, on a real Prometheus ---


def snake(relabel: dict) -> dict:
    """A PodMonitor relabeling (the CRD's camelCase) as Prometheus's relabel_config."""
    names = {"sourceLabels": "source_labels", "targetLabel": "target_label", "action": "action", "regex": "regex",
             "replacement": "replacement", "separator": "separator", "modulus": "modulus"}  # fmt: skip
    assert set(relabel) <= set(names), relabel
    return {names[k]: v for k, v in relabel.items()}


def sanitize(label: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def operator_relabelings(monitor: dict, n: int, namespace: str) -> list[dict]:
    """The relabel_configs the operator (v0.93.0, pkg/prometheus/promcfg.go's
    generatePodMonitorConfig) writes for endpoint n of a PodMonitor, its own relabelings last."""
    ep = monitor["spec"]["podMetricsEndpoints"][n]
    out = [
        {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"},
    ]
    for key, value in sorted(monitor["spec"]["selector"]["matchLabels"].items()):
        label = sanitize(key)
        sources = [f"__meta_kubernetes_pod_label_{label}", f"__meta_kubernetes_pod_labelpresent_{label}"]
        out.append({"action": "keep", "source_labels": sources, "regex": f"({value});true"})
    out.append({"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": ep["port"]})
    out += [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"target_label": "job", "replacement": f"{namespace}/{monitor['metadata']['name']}"},
        {"target_label": "endpoint", "replacement": ep["port"]},
    ]
    return out + [snake(r) for r in ep.get("relabelings", [])]


def pod_targets(pods: list[dict], addresses: dict[tuple[int, str], str]) -> list[dict]:
    """file_sd groups as Kubernetes service discovery (role pod) gives them: one per declared
    container port of each pod, with the __meta_kubernetes_pod_* labels a pod of the Job has."""
    groups = []
    for pod in pods:
        labels = {
            "__meta_kubernetes_namespace": NAMESPACE, "__meta_kubernetes_pod_name": pod["name"],
            "__meta_kubernetes_pod_node_name": pod["node"], "__meta_kubernetes_pod_phase": "Running",
            "__meta_kubernetes_pod_ip": "10.0.0.1", "__meta_kubernetes_pod_container_name": "trainer",
        }  # fmt: skip
        for key, value in pod["labels"].items():
            labels[f"__meta_kubernetes_pod_label_{sanitize(key)}"] = value
            labels[f"__meta_kubernetes_pod_labelpresent_{sanitize(key)}"] = "true"
        for port in pod["ports"]:
            address = addresses.get((pod["index"], port["name"]), "127.0.0.1:9")  # a port nothing serves: dropped
            groups.append({"targets": [address], "labels": {**labels,
                           "__meta_kubernetes_pod_container_port_name": port["name"],
                           "__meta_kubernetes_pod_container_port_number": str(port["containerPort"])}})  # fmt: skip
    return groups


@pytest.mark.integration
def test_the_monitors_relabelings_give_every_series_run_id_rank_and_node(rendered, tmp_path):
    """Two ranks on two nodes: real rank exporters (serving the lab's simulated node names) and
    rank 0's training metrics, behind file_sd targets shaped as the pods of the four-rank Job
    (two of its four pods, every declared port, and a pod of another release), scraped by a real
    Prometheus with the relabel configuration of the rendered PodMonitors. The series arrive with
    the pod's run_id, its completion index as rank and its node, on the rules' job names."""
    docs = rendered["four ranks"]
    [job] = of_kind(docs, "Job")
    template = job["spec"]["template"]
    ports = template["spec"]["containers"][0]["ports"]
    run_id = template["metadata"]["labels"]["runwatch/run-id"]
    nodes = {0: "gpu-node-a", 1: "gpu-node-b"}
    servers = []
    addresses: dict[tuple[int, str], str] = {}
    for rank in nodes:
        m = RankMetrics(run_id=run_id, rank=rank, node=f"node{rank}", gpu="0", uuid=f"GPU-{rank}")
        m.observe(step=7, compute=1.0, wait=0.02, step_seconds=1.03)
        m.observe_gpu(temp_c=62.0, sm_clock_mhz=1980.0, power_w=500.0, fb_used_mib=1024.0, xid=0)
        servers.append(exporter_server.start(m.registry, port=0))
        addresses[(rank, f"rank-{rank}")] = f"127.0.0.1:{servers[-1].server_address[1]}"
    trainer = TrainerMetrics(run_id=run_id, seed=0, incident="straggler")
    servers.append(exporter_server.start(trainer.registry, port=0))
    addresses[(0, "metrics")] = f"127.0.0.1:{servers[-1].server_address[1]}"
    launcher = LauncherMetrics(run_id=run_id, ettr=lambda: None)
    servers.append(exporter_server.start(launcher.registry, port=0))
    addresses[(0, "launcher")] = f"127.0.0.1:{servers[-1].server_address[1]}"
    pods = [{"name": f"{job['metadata']['name']}-{i}-x", "node": nodes[i], "index": i, "ports": ports,
             "labels": {**template["metadata"]["labels"], "batch.kubernetes.io/job-completion-index": str(i)}}
            for i in nodes]  # fmt: skip
    other = copy.deepcopy(pods[1])  # the same run's pod, of another release: no monitor of this one keeps it
    other["labels"]["app.kubernetes.io/instance"] = "someone-else"
    (tmp_path / "pods.json").write_text(json.dumps(pod_targets([*pods, other], addresses)))

    jobs = []
    for monitor in of_kind(docs, "PodMonitor"):
        for n, ep in enumerate(monitor["spec"]["podMetricsEndpoints"]):
            jobs.append({
                "job_name": f"podMonitor/{NAMESPACE}/{monitor['metadata']['name']}/{n}",
                "honor_labels": ep.get("honorLabels", False),
                "scrape_interval": ep["interval"], "scrape_timeout": ep["scrapeTimeout"],
                "file_sd_configs": [{"files": [str(tmp_path / "pods.json")]}],
                "relabel_configs": operator_relabelings(monitor, n, NAMESPACE),
                "metric_relabel_configs": [snake(r) for r in ep.get("metricRelabelings", [])],
            })  # fmt: skip
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({"scrape_configs": jobs}))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    argv = prometheus_argv(need("prometheus"), tmp_path / "prometheus.yml", tmp_path / "data", port)
    try:
        with Process(argv, f"{base}/-/ready", tmp_path / "prometheus.log"):
            # one scrape of each target at the monitors' 1 s interval; 30 s is ample
            up = wait_for(lambda: (r := instant(base, "up")) and len(r) >= 4 and r, 30, "the targets' first scrapes")
            steps = wait_for(lambda: instant(base, "runwatch_rank_step"), 10, "the ranks' steps")
            gpus = wait_for(lambda: instant(base, "DCGM_FI_DEV_GPU_TEMP"), 10, "the ranks' GPUs")
            trained = wait_for(lambda: instant(base, '{job="trainer"}'), 10, "the trainer's series")
            active = requests.get(f"{base}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
    finally:
        for s in servers:
            threading.Thread(target=s.shutdown, daemon=True).start()
    # of the 3 pods' 21 declared ports (another release's pod among them), 4 targets are kept
    assert len(active) == 4, [t["labels"] for t in active]
    targets = {(s["metric"]["job"], s["metric"].get("rank", "")): s for s in up}
    assert sorted(targets) == [("launcher", ""), ("ranks", "0"), ("ranks", "1"), ("trainer", "")], sorted(targets)
    assert all(s["value"][1] == "1" for s in up)
    for s in [*(targets[("ranks", r)] for r in "01"), *steps, *gpus]:
        labels = s["metric"]
        rank = int(labels["rank"])
        assert (labels["run_id"], labels["node"], labels["namespace"]) == (run_id, nodes[rank], NAMESPACE), labels
        assert not [k for k in labels if k.startswith("exported_")], labels
    assert sorted((s["metric"]["rank"], s["metric"]["node"]) for s in steps) == [
        ("0", "gpu-node-a"),
        ("1", "gpu-node-b"),
    ]
    # dcgm-exporter's Hostname names the node, so that GPUThermalThrottle and GPUXidError do
    assert sorted((s["metric"]["rank"], s["metric"]["Hostname"]) for s in gpus) == sorted(
        (str(r), n) for r, n in nodes.items()
    )
    assert {(s["metric"]["run_id"], s["metric"]["node"]) for s in trained} == {(run_id, "gpu-node-a")}
    assert targets[("launcher", "")]["metric"]["run_id"] == run_id
    assert not [s for s in trained if any(k.startswith("exported_") for k in s["metric"])]


# --- the Job's pods: the lab's launcher over MPICH, no SSH ---


@pytest.mark.integration
def test_the_job_s_pods_run_the_lab_s_launcher_over_mpich_without_ssh(tmp_path):
    """The two-rank Job's pod command, run as two pods would run it: pod 0's launcher
    (`runwatch train --ranks 2`) and pod 1, each with its own JOB_COMPLETION_INDEX, on two
    loopback addresses in the place of the pods' names (127.0.0.1 and 127.0.0.2), the rendered
    script otherwise unchanged; the run is shortened (20 steps of 0.05 s) and waits for no
    Prometheus. Both ranks train, over MPICH's manual launch, and the run completes."""
    [job] = of_kind(render(*STACK, "--set", "trainer.ranks=2"), "Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    shell, flag, script, *argv = container["command"]
    name = job["metadata"]["name"]
    env = {e["name"]: e["value"] for e in container["env"]}
    bin_dir = Path(sys.executable).parent
    argv = [a.replace("/data/runs", str(tmp_path / "runs")) for a in argv if a != "--wait-for-prometheus"]
    argv = [str(bin_dir / "runwatch") if a == "runwatch" else "--hold=0" if a.startswith("--hold") else a for a in argv]
    argv += ["--steps=20", "--onset=10", "--step-seconds=0.05"]
    pods = []
    for index in (1, 0):
        hosts = tmp_path / f"hosts-{index}"  # each pod's own /tmp
        text = edit_text(script, f"launcher={name}-0.{name}", "launcher=127.0.0.1")
        text = edit_text(text, f'"{name}-$i.{name}:1"', '"127.0.0.$((i + 1)):1"')
        text = edit_text(text, env["HYDRA_HOST_FILE"], str(hosts))
        pod_env = {**os.environ, **env, "HYDRA_HOST_FILE": str(hosts), "JOB_COMPLETION_INDEX": str(index),
                   "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "MPLCONFIGDIR": str(tmp_path)}  # fmt: skip
        # into a file: pod 0's proxy, in the background, holds its output open after the launcher ends
        with open(tmp_path / f"pod-{index}.log", "w") as log:
            pods.append(subprocess.Popen(
                [shell, flag, text, *argv], env=pod_env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            ))  # fmt: skip
    try:
        pods[1].wait(timeout=120)  # the launcher's pod: 20 steps of 0.05 s, and the ranks' start
        out = (tmp_path / "pod-0.log").read_text() + (tmp_path / "pod-1.log").read_text()
    finally:
        for pod in pods:  # pod 1's proxy loops until the Job ends it (successPolicy)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pod.pid, signal.SIGTERM)
            pod.wait(timeout=30)
    assert pods[1].returncode == 0, out[-3000:]
    assert "run none-0 rank 1: serving http://0.0.0.0:8101/metrics" in out  # started by pod 1's proxy
    assert "run none-0: completed" in out
    run = tmp_path / "runs" / "none-0"
    assert json.loads((run / "run.json").read_text())["status"] == "completed"
    assert (run / "rank-1.json").exists()


def edit_text(text: str, old: str, new: str) -> str:
    assert old in text, f"the pod script no longer contains {old!r}"
    return text.replace(old, new)


def service_monitor_relabelings(monitor: dict, n: int) -> list[dict]:
    """The relabel_configs the operator (v0.93.0, generateServiceMonitorConfig, role endpoints)
    writes for endpoint n of a ServiceMonitor, its own relabelings last."""
    ep = monitor["spec"]["endpoints"][n]
    target = ["__meta_kubernetes_endpoint_address_target_kind", "__meta_kubernetes_endpoint_address_target_name"]
    out = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
    for key, value in sorted(monitor["spec"]["selector"]["matchLabels"].items()):
        label = sanitize(key)
        sources = [f"__meta_kubernetes_service_label_{label}", f"__meta_kubernetes_service_labelpresent_{label}"]
        out.append({"action": "keep", "source_labels": sources, "regex": f"({value});true"})
    out += [
        {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": ep["port"]},
        {"source_labels": target, "regex": "Node;(.*)", "replacement": "${1}", "target_label": "node"},
        {"source_labels": target, "regex": "Pod;(.*)", "replacement": "${1}", "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"},
        {"target_label": "endpoint", "replacement": ep["port"]},
    ]
    return out + [snake(r) for r in ep.get("relabelings", [])]


@pytest.mark.integration
def test_the_pager_s_service_monitor_scrapes_it_as_job_pager(rendered, tmp_path):
    """A real pager behind file_sd targets shaped as the endpoints of the rendered pager and
    console Services, scraped with the relabel configuration the operator writes for the pager's
    ServiceMonitor: one target, the pager, on job="pager" (PagerDown's `up{job="pager"}`)."""
    from runwatch.oncall.server import make_server

    docs = rendered["one rank"]
    [monitor] = of_kind(docs, "ServiceMonitor")
    pager = make_server("127.0.0.1", 0, tmp_path / "pages.jsonl")
    threading.Thread(target=pager.serve_forever, daemon=True).start()
    groups = []
    for service in of_kind(docs, "Service"):
        component = service["metadata"]["labels"]["app.kubernetes.io/component"]
        labels = {
            "__meta_kubernetes_namespace": NAMESPACE, "__meta_kubernetes_service_name": service["metadata"]["name"],
            "__meta_kubernetes_endpoint_address_target_kind": "Pod",
            "__meta_kubernetes_endpoint_address_target_name": f"{service['metadata']['name']}-0",
            "__meta_kubernetes_pod_name": f"{service['metadata']['name']}-0", "__meta_kubernetes_pod_phase": "Running",
            "__meta_kubernetes_pod_container_name": component,
        }  # fmt: skip
        for key, value in service["metadata"]["labels"].items():
            labels[f"__meta_kubernetes_service_label_{sanitize(key)}"] = value
            labels[f"__meta_kubernetes_service_labelpresent_{sanitize(key)}"] = "true"
        for port in service["spec"]["ports"]:
            address = f"127.0.0.1:{pager.server_address[1]}" if component == "pager" else "127.0.0.1:9"
            port_label = {"__meta_kubernetes_endpoint_port_name": port["name"]}
            groups.append({"targets": [address], "labels": {**labels, **port_label}})
    (tmp_path / "endpoints.json").write_text(json.dumps(groups))
    jobs = [
        {"job_name": f"serviceMonitor/{NAMESPACE}/{monitor['metadata']['name']}/{n}",
         "scrape_interval": ep["interval"], "scrape_timeout": ep["scrapeTimeout"],
         "file_sd_configs": [{"files": [str(tmp_path / "endpoints.json")]}],
         "relabel_configs": service_monitor_relabelings(monitor, n)}
        for n, ep in enumerate(monitor["spec"]["endpoints"])
    ]  # fmt: skip
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({"scrape_configs": jobs}))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    argv = prometheus_argv(need("prometheus"), tmp_path / "prometheus.yml", tmp_path / "data", port)
    try:
        with Process(argv, f"{base}/-/ready", tmp_path / "prometheus.log"):
            up = wait_for(lambda: instant(base, 'up{job="pager"}'), 30, "the pager's first scrape")
            active = requests.get(f"{base}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
    finally:
        threading.Thread(target=pager.shutdown, daemon=True).start()
    assert len(active) == 1, [t["labels"] for t in active]
    [series] = up
    assert series["value"][1] == "1"
    assert (series["metric"]["service"], series["metric"]["namespace"]) == ("rw-runwatch-pager", NAMESPACE)


# --- issue 40, N25: who reaches the trainer and the pager, the pager's token, every cap ---


def pod_spec(doc: dict) -> dict:
    return doc["spec"]["template"]["spec"]


def selected(policy: dict, docs: list[dict]) -> list[str]:
    """The workloads whose pods the policy's podSelector selects."""
    want = policy["spec"]["podSelector"]["matchLabels"].items()
    return [d["metadata"]["name"] for d in docs if d["kind"] in ("Deployment", "Job")
            and want <= d["spec"]["template"]["metadata"]["labels"].items()]  # fmt: skip


@pytest.mark.integration
@pytest.mark.parametrize("render_name", RENDERS)
def test_only_the_stack_s_prometheus_and_alertmanager_reach_the_trainer_and_pager(rendered, render_name):
    """N25: any pod could page or ack. Ingress to the pager: the stack's Prometheus and
    Alertmanager pods (in its namespace) and the chart's console; to the trainer: the stack's
    Prometheus and the run's own ranks (MPICH). No rule lets anyone else in."""
    docs = rendered[render_name]
    policies = {p["metadata"]["labels"]["app.kubernetes.io/component"]: p for p in of_kind(docs, "NetworkPolicy")}
    assert set(policies) == {"pager", "trainer"}
    stack = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    prometheus = {**stack, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
    alertmanager = {**stack, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "alertmanager"}}}
    ours = {"app.kubernetes.io/name": "runwatch", "app.kubernetes.io/instance": RELEASE}
    console = {"podSelector": {"matchLabels": {**ours, "app.kubernetes.io/component": "console"}}}
    ranks = {"podSelector": {"matchLabels": {**ours, "app.kubernetes.io/component": "trainer"}}}
    expected = {"pager": [prometheus, alertmanager, console], "trainer": [prometheus, ranks]}
    for component, policy in policies.items():
        assert selected(policy, docs) == [f"rw-runwatch-{component}"]
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        assert policy["spec"]["ingress"] == [{"from": expected[component]}], component  # no port-only rule: no one else
    off = render(*STACK, "--set", "networkPolicy.enabled=false")
    assert not of_kind(off, "NetworkPolicy")


@pytest.mark.integration
def test_alertmanager_s_webhooks_carry_the_pager_s_token_from_a_secret(rendered, tmp_path):
    """N25: the chart's pager took any webhook. The Secret the AlertmanagerConfig's webhooks name
    is the one the pager reads its --token-file from; the real pager, run with the rendered
    arguments and that token, refuses a webhook without it and takes one with it."""
    import base64

    docs = rendered["one rank"]
    [amc] = of_kind(docs, "AlertmanagerConfig")
    credentials = [w["httpConfig"]["authorization"] for r in amc["spec"]["receivers"] for w in r["webhookConfigs"]]
    assert credentials and all(c["type"] == "Bearer" for c in credentials)
    [ref] = {json.dumps(c["credentials"], sort_keys=True) for c in credentials}
    ref = json.loads(ref)
    [secret] = [d for d in of_kind(docs, "Secret") if d["metadata"]["name"] == ref["name"]]
    token = base64.b64decode(secret["data"][ref["key"]]).decode()
    [pager] = [d for d in of_kind(docs, "Deployment") if d["metadata"]["name"] == "rw-runwatch-pager"]
    [container] = pod_spec(pager)["containers"]
    [volume] = [v for v in pod_spec(pager)["volumes"] if v.get("secret", {}).get("secretName") == ref["name"]]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    [token_file] = [a.split("=", 1)[1] for a in container["command"] if a.startswith("--token-file=")]
    assert token_file == f"{mount['mountPath']}/{ref['key']}"
    (tmp_path / ref["key"]).write_text(token)
    (tmp_path / "runbooks").mkdir()
    port = free_port()
    moved = {"--host": "127.0.0.1", "--port": str(port), "--log": str(tmp_path / "pages.jsonl"),
             "--runbooks": str(tmp_path / "runbooks"), "--token-file": str(tmp_path / ref["key"]),
             "--prometheus": "http://127.0.0.1:9"}  # fmt: skip
    argv = [sys.executable, "-m", "runwatch", *(
        f"{a.split('=', 1)[0]}={moved[a.split('=', 1)[0]]}" if a.split("=", 1)[0] in moved else a
        for a in container["command"][1:]
    )]  # fmt: skip
    [host] = [a.split("=", 1)[1] for a in container["command"] if a.startswith("--allow-host=")]
    webhook = json.dumps({"version": "4", "status": "firing", "receiver": "oncall-page", "alerts": []})
    with Process(argv, f"http://127.0.0.1:{port}/-/ready", tmp_path / "pager.log"):

        def post(**headers: str) -> int:
            return requests.post(f"http://127.0.0.1:{port}/webhook", data=webhook, timeout=10, headers={
                "Host": host, "Content-Type": "application/json", **headers}).status_code  # fmt: skip

        assert post() == 401
        assert post(Authorization="Bearer not-the-token-at-all") == 401
        assert post(Authorization=f"Bearer {token}") != 401
    mine = render(*STACK, "--set", "pager.tokenSecret=mine")
    assert not of_kind(mine, "Secret")
    [amc] = of_kind(mine, "AlertmanagerConfig")
    assert {w["httpConfig"]["authorization"]["credentials"]["name"] for r in amc["spec"]["receivers"]
            for w in r["webhookConfigs"]} == {"mine"}  # fmt: skip


@pytest.mark.integration
def test_the_console_s_ack_carries_the_pager_s_token(rendered):
    """The pager takes an ack only with its token: the chart's console reads it from the pager's
    Secret (--pager-token-file), or every Ack clicked in it would be refused."""
    docs = rendered["one rank"]
    [pager] = [d for d in of_kind(docs, "Deployment") if d["metadata"]["name"] == "rw-runwatch-pager"]
    [console] = [d for d in of_kind(docs, "Deployment") if d["metadata"]["name"] == "rw-runwatch-console"]

    def token_file(deployment: dict, flag: str) -> tuple[str, str]:
        """The Secret a container's token flag reads from, and the key."""
        spec = pod_spec(deployment)
        [container] = spec["containers"]
        [path] = [a.split("=", 1)[1] for a in container["command"] if a.startswith(f"{flag}=")]
        [mount] = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
        [volume] = [v for v in spec["volumes"] if v["name"] == mount["name"]]
        return volume["secret"]["secretName"], path.removeprefix(mount["mountPath"] + "/")

    assert token_file(console, "--pager-token-file") == token_file(pager, "--token-file")


@pytest.mark.integration
@pytest.mark.parametrize("render_name", RENDERS)
def test_every_scratch_folder_and_container_is_capped(rendered, render_name):
    """N25: the /tmp emptyDirs had no sizeLimit, and no container a CPU limit."""
    for doc in (d for d in rendered[render_name] if d["kind"] in ("Deployment", "Job")):
        spec = pod_spec(doc)
        for volume in (v for v in spec["volumes"] if "emptyDir" in v):
            assert volume["emptyDir"].get("sizeLimit"), (doc["metadata"]["name"], volume)
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            limits = container.get("resources", {}).get("limits", {})
            assert limits.get("cpu") and limits.get("memory"), (doc["metadata"]["name"], container["name"])
