"""The Grafana dashboards: generated as code, provisioned by uid, and every query run for real.

No Grafana runs here, so the proof is this: every panel target, annotation query and template
variable of every dashboard is executed against the session's live Prometheus, holding a real
corrupt_shard run past its onset (the worker's shared lab), with Grafana's variables substituted
as Grafana would.
"""

from __future__ import annotations

import importlib.util
import json
import struct
import subprocess
import time

import pytest
import yaml

from runwatch.console.sources import Sources
from runwatch.core.names import FIRST_FIRED
from runwatch.core.paths import REPO
from runwatch.oncall.page_log import read_pages
from runwatch.prom.server import Process, free_port, instant, prometheus_argv
from runwatch.readouts import dashboard_queries as dq
from runwatch.readouts.picture import collect, draw, windows
from runwatch.trainer.config import TrainConfig
from runwatch.trainer.faults import checkpoint_before, fault_of
from runwatch.trainer.gpu import NOMINAL_SM_MHZ, gpu_index, node_of, struck_rank
from runwatch.trainer.offline import simulate, write_openmetrics
from runwatch.trainer.run import Trainer
from tests.conftest import need, runwatch, wait_for
from tests.test_lab_e2e import ExtraTrainer

ALERTS = ("TrainingLossJump", "GradientNormJump", "HeldOutGap", "ThroughputDrop")
DASHBOARDS = REPO / "grafana" / "dashboards"
FILES = sorted(DASHBOARDS.glob("*.json"))


def generator():
    spec = importlib.util.spec_from_file_location("dashboards_gen", REPO / "grafana" / "dashboards.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def provisioned_uids() -> set[str]:
    doc = yaml.safe_load((REPO / "grafana" / "provisioning" / "datasources" / "datasources.yml").read_text())
    return {d["uid"] for d in doc["datasources"]}


def test_regenerating_changes_nothing():
    rendered = generator().render()
    assert sorted(rendered) == [f.name for f in FILES]
    for f in FILES:
        assert rendered[f.name] == f.read_text(), f"run python grafana/dashboards.py ({f.name} is stale)"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_dashboard_hygiene(path):
    dash = dq.load(path)
    assert dash["uid"].startswith("runwatch-")
    uids = provisioned_uids()
    for panel in dash["panels"]:
        assert panel["type"] not in ("graph", "singlestat", "table-old"), "Angular panel"
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] in uids, panel["title"]
        for t in panel.get("targets", []):
            assert t["datasource"]["uid"] in uids
    for q in dq.queries(dash):
        assert q.datasource_uid in uids, q


def test_the_datasources_and_the_dashboard_folder_are_provisioned():
    doc = yaml.safe_load((REPO / "grafana" / "provisioning" / "datasources" / "datasources.yml").read_text())
    types = {d["uid"]: (d["type"], d.get("jsonData", {}).get("implementation")) for d in doc["datasources"]}
    assert types == {
        "runwatch-prometheus": ("prometheus", None),
        "runwatch-alertmanager": ("alertmanager", "prometheus"),
    }
    prov = yaml.safe_load((REPO / "grafana" / "provisioning" / "dashboards" / "runwatch.yml").read_text())
    (provider,) = prov["providers"]
    assert provider["folder"] == "runwatch" and provider["allowUiUpdates"] is False


def test_substitution_as_grafana_does_it():
    expr = 'rate(x{run_id="$run"}[$__rate_interval]) + y[$__range] + z[${__interval}] + $__range_s'
    out = dq.substitute(expr, {"run": "r-1"}, range_s=900)
    assert out == 'rate(x{run_id="r-1"}[4s]) + y[900s] + z[1s] + 900'


@pytest.fixture
def incident(lab):
    """The session lab's corrupt_shard run, once it is 15 steps past its onset and has paged."""
    prom = lab.url("prometheus")
    wait_for(
        lambda: instant(prom, f'runwatch_train_step{{run_id="{lab.run_id}"}} >= 315'), 90, "the run to pass step 315"
    )
    return lab


def lab_start(lab) -> float:
    """A little before `runwatch up` started the lab (its lab.json says when)."""
    return json.loads((lab.state / "lab.json").read_text())["started_at"] - 5


def run_all(lab, path):
    prom = lab.url("prometheus")
    end = time.time()
    start = lab_start(lab)  # Grafana's range would cover the run
    results = {}
    for q in dq.queries(dq.load(path)):
        results[(q.kind, q.title, q.ref)] = (q, dq.run(prom, q, {"run": lab.run_id}, start, end))
    return results


# In a lab whose only incident is a corrupt shard, no run has fired these two: their table
# columns are rightly empty, as is the cluster row for a run of one process (its queries are
# run against a cluster run below). Every other query must return series.
EMPTY_HERE = {("Readouts of every run", "C"), ("Readouts of every run", "D"), ("Run", "C")}  # C: the run ended


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_query_is_accepted_and_returns_series(incident, path):
    for (kind, title, ref), (q, result) in run_all(incident, path).items():
        if (title, ref) in EMPTY_HERE or title in CLUSTER_TITLES:
            assert result == [], f"{title!r} {ref} should be empty here: {q.expr}"
        else:
            assert result, f"{kind} {title!r} {ref} returned nothing: {q.expr}"


def test_the_watching_a_run_queries_say_what_they_should(incident):
    results = run_all(incident, DASHBOARDS / "watching-a-run.json")
    runs = {r["metric"]["value"] for r in results[("variable", "run", "")][1]}
    assert incident.run_id in runs and any("control" in r for r in runs)

    readouts = {
        q.legend: int(float(r[0]["value"][1]))
        for (k, title, _), (q, r) in results.items()
        if k == "panel" and title.startswith("Readouts: step")
    }
    assert readouts["TrainingLossJump"] in (300, 301, 302)
    assert readouts["GradientNormJump"] in (300, 301)
    assert readouts["HeldOutGap"] == -1 and readouts["ThroughputDrop"] == -1  # shown as "—"

    table = {}
    for (k, title, ref), (_q, result) in results.items():
        if k == "panel" and title == "Readouts of every run" and ref != "RUNS":
            for row in result:
                table.setdefault(row["metric"]["run_id"], {})[ref] = int(float(row["value"][1]))
    assert table[incident.run_id]["B"] == readouts["GradientNormJump"]
    assert not any("control" in run for run in table)  # the healthy control never fired

    window = results[("annotation", "Incident window", "")][1]
    assert window and all(v == "1" for _, v in window[0]["values"])
    fired = {r["metric"]["alertname"] for r in results[("annotation", "Firing alerts", "")][1]}
    assert {"TrainingLossJump", "GradientNormJump"} <= fired

    dots = results[("panel", "Training loss (thin) and held-out loss (dots)", "B")][1][0]["values"]
    steps = {int(float(v)) for _, v in instant_range(incident)}
    assert 0 < len(dots) < len(steps) / 5  # one dot per held-out evaluation, not one per step


def test_every_readout_is_the_first_fire_recorded_once(incident, tmp_path):
    """The record alerts.yml writes when an alert fires is what the page says, what the
    dashboard's readouts and table say at any time range, and what the plate prints."""
    prom = incident.url("prometheus")
    run = incident.run_id
    wait_for(lambda: paged(incident, "GradientNormJump"), 60, "GradientNormJump to page")
    record = {
        r["metric"]["alertname"]: int(float(r["value"][1])) for r in instant(prom, f'{FIRST_FIRED}{{run_id="{run}"}}')
    }
    assert {"TrainingLossJump", "GradientNormJump"} <= set(record) and "HeldOutGap" not in record
    assert 300 <= record["GradientNormJump"] <= 302, record

    # The page's step was read at the same evaluation, and the page carries the rule that fired.
    for alert in ("TrainingLossJump", "GradientNormJump"):
        page = paged(incident, alert)
        assert page["step"] == str(record[alert]), (alert, page["step"], record)
        held = f'alert:runwatch_threshold:ratio{{alertname="{alert}"}}'
        assert page["rule"]["thresholds"] == {held: "vector(3)"} and page["rule"]["for"] == "0s", page["rule"]

    # At the range of the whole run, and at one that begins long after the alerts fired.
    path = DASHBOARDS / "watching-a-run.json"
    end = time.time()
    for start in (lab_start(incident), end - 10):
        readouts = {
            q.legend: int(float(r[0]["value"][1]))
            for q in dq.queries(dq.load(path))
            if q.kind == "panel" and q.title.startswith("Readouts: step")
            for r in [dq.run(prom, q, {"run": run}, start, end)]
        }
        assert {a: s for a, s in readouts.items() if s != -1} == {a: record[a] for a in readouts if a in record}

    # The plate (and the console's "first fired" line) lists every alert that fired in the run,
    # those the panel does not name too
    assert {a: s for a, s in collect(prom, run, since_s=600).readouts.items() if s is not None} == record


def paged(lab, alert: str) -> dict | None:
    pages = [p for p in read_pages(lab.state / "pages.jsonl") if p["run_id"] == lab.run_id and p["alert"] == alert]
    return next((p for p in pages if p["status"] == "firing"), None)


def test_the_newest_run_is_the_default_and_a_finished_run_says_when_it_ended(incident):
    """Grafana's default is the $run variable's first option: the runs come newest first, by
    start time (their ids sort by incident). The Run panel gives each run's step, and an end
    time only once the run has finished its last step."""
    prom = incident.url("prometheus")
    short = ExtraTrainer(incident, "short", "--steps", "325", "--fast-forward", "315")
    try:
        wait_for(lambda: instant(prom, f'runwatch_train_run_end_time_seconds{{run_id="{short.run_id}"}}'), 60,
                 "the short run to finish")  # fmt: skip
        path = DASHBOARDS / "watching-a-run.json"
        queries = dq.queries(dq.load(path))
        [variable] = [q for q in queries if q.kind == "variable"]
        end = time.time()
        runs = [r["metric"]["value"] for r in dq.run(prom, variable, {}, end - 900, end)]
        started = [
            float(instant(prom, f'runwatch_train_run_start_time_seconds{{run_id="{r}"}}', end)[0]["value"][1])
            for r in runs
        ]
        assert runs[0] == short.run_id and incident.run_id in runs
        assert started == sorted(started, reverse=True), list(zip(runs, started, strict=True))

        def run_panel(run: str) -> dict[str, float]:
            shown = {}
            for q in (q for q in queries if q.kind == "panel" and q.title == "Run"):
                for r in dq.run(prom, q, {"run": run}, end - 900, end):
                    shown[q.legend] = float(r["value"][1])
            return shown

        finished, running = run_panel(short.run_id), run_panel(incident.run_id)
        assert finished["step"] == 324 and finished["started"] < finished["ended"] <= end * 1000
        assert running["step"] >= 315 and "ended" not in running
    finally:
        short.close()


def test_the_step_panel_draws_each_step_as_trained_and_every_held_out_dot_at_long_ranges(incident):
    """The trend panel's drawing (each curve joined by time to the step): every point sits at
    the step whose loss the trainer computed, and the held-out dots stay, one per evaluation,
    at a 2-hour range as at the run's own; so do the time panel's."""
    prom = incident.url("prometheus")
    run = incident.run_id
    config = json.loads((incident.runs / run / "run.json").read_text())["config"]
    trainer = Trainer(TrainConfig(**config))
    trained = {}
    end = time.time()  # the queries' end, fixed first: the run goes on while this trains its steps
    now = int(float(instant(prom, f'runwatch_train_step{{run_id="{run}"}}', end)[0]["value"][1]))
    while trainer.next_step <= now:
        rec = trainer.step()
        trained[rec.step] = rec

    path = DASHBOARDS / "watching-a-run.json"
    dots, time_dots = {}, {}
    for label, start in (("run", lab_start(incident)), ("2h", end - 7200)):
        drawn = {}
        for q in dq.queries(dq.load(path)):
            if q.kind == "panel" and q.title == "Training loss by step (the plate's x axis)":
                [series] = dq.run(prom, q, {"run": run}, start, end) or [{"values": []}]
                drawn[q.legend] = series["values"]
        by_step = dq.by_field(drawn, "step")
        loss = by_step["training loss"]
        assert len(loss) > 30 and [s for s, _ in loss] == sorted(s for s, _ in loss)
        for step, value in loss:
            assert value == pytest.approx(trained[int(step)].loss, rel=1e-9), step
        held = by_step["held-out loss"]
        assert held and all(int(s) % 10 == 0 for s, _ in held)
        for step, value in held:
            assert value == pytest.approx(trained[int(step)].heldout_loss, rel=1e-9), step
        dots[label] = {int(s) for s, _ in held}
        [[time_panel]] = [
            dq.run(prom, q, {"run": run}, start, end)
            for q in dq.queries(dq.load(path))
            if q.kind == "panel" and q.title.startswith("Training loss (thin)") and q.legend == "held-out loss"
        ]
        time_dots[label] = [t for t, _ in time_panel["values"]]
    assert dots["2h"] == dots["run"], dots
    assert time_dots["2h"] == time_dots["run"], time_dots


def instant_range(lab):
    prom = lab.url("prometheus")
    end = time.time()
    return dq.run(prom, dq.Query("panel", "", "", f'runwatch_train_step{{run_id="{lab.run_id}"}}'), {}, end - 60, end)[
        0
    ]["values"]


def test_the_plate_picture_from_the_live_run(incident, tmp_path):
    prom = incident.url("prometheus")
    data = collect(prom, incident.run_id, since_s=600)
    assert data.readouts["GradientNormJump"] in (300, 301) and data.readouts["HeldOutGap"] is None
    assert {"training loss", "held-out loss"} <= set(data.series["loss"])
    steps = [s for s, _ in data.series["loss"]["training loss"]]
    # One window over the shard's steps 300-329 that Prometheus scraped. A step can fall between
    # two scrapes and never reach Prometheus (300 did, on CI once); it must not split the window.
    assert data.incident == [(min(s for s in steps if s >= 300), max(s for s in steps if s <= 329))]
    assert min(steps) <= 290 and max(steps) >= 315
    out = tmp_path / "plate.png"
    draw(data, out)
    head = out.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    assert (width, height) == (1000, 900) and out.stat().st_size > 30_000
    assert out.stat().st_mode & 0o777 == 0o644  # readable beside the postmortem, as every report is
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def throughput(data) -> list[tuple[int, float]]:
    return data.series["throughput"]["per step"]


def test_throughput_is_flat_on_a_healthy_run_and_drops_below_the_threshold_on_a_slow_node(incident, tmp_path):
    """The drawn series, not only the query: a healthy run (the corrupt shard's throughput is
    healthy) stays flat, where rate() of the token counter showed drops of a third, to 44k;
    a slow node's steps from the onset fall 30%, below the dashed ThroughputDrop threshold."""
    prom = incident.url("prometheus")
    healthy = [v for _, v in throughput(collect(prom, incident.run_id, since_s=600))]
    middle = sorted(healthy)[len(healthy) // 2]
    # Flat: its 2% jitter (6% at three sigmas), and a step woken late on a loaded machine (8%
    # seen while the suite's other worker ran four MPI ranks): within 15%, far from a third.
    assert len(healthy) > 40 and all(0.85 < v / middle < 1.15 for v in healthy), (min(healthy), max(healthy))

    slow = ExtraTrainer(incident, "slow", "--incident", "slow_node", "--fast-forward", "280")
    try:
        wait_for(lambda: slow.step() >= 307, 60, "seven steps of the slow node")
        data = collect(prom, slow.run_id, since_s=600)
    finally:
        slow.close()
    before = [v for step, v in throughput(data) if step < 300]
    after = [v for step, v in throughput(data) if step >= 300]
    ratio = (sum(after) / len(after)) / (sum(before) / len(before))
    assert 0.66 < ratio < 0.74, ratio
    # Below the dashed threshold as the drop begins: the first step that has a baseline (20
    # samples, from about step 303 after this fast-forward). Then the baseline takes in the slow
    # steps and the line comes down to them (ThroughputDrop sees a drop, not a level): with only
    # 20 healthy steps behind it, a slow step can meet the line 3 steps later (seen: step 307).
    threshold = dict(data.series["throughput"]["alert threshold (ThroughputDrop)"])
    first = min(step for step, _ in throughput(data) if step >= 302 and step in threshold)
    assert dict(throughput(data))[first] < threshold[first], (first, throughput(data), threshold)


def test_incident_windows_join_across_unscraped_steps_only():
    observed = {299, 301, 303, 304, 306, 310, 311}  # 300, 302, 305 fell between scrapes
    assert windows([301, 303, 304, 306], observed) == [(301, 306)]
    assert windows([301, 303, 306], observed) == [(301, 303), (306, 306)]  # 304 was scraped inactive
    assert windows([], observed) == []


def test_plate_command_line(incident, tmp_path):
    res = runwatch(
        "plate",
        "--state-dir",
        str(incident.state),
        "--run",
        incident.run_id,
        "--out",
        str(tmp_path / "p.png"),
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert "GradientNormJump 30" in res.stdout
    res = runwatch(
        "plate",
        "--state-dir",
        str(incident.state),
        "--run",
        "no-such-run",
        "--out",
        str(tmp_path / "q.png"),
        cwd=tmp_path,
    )
    assert res.returncode == 2 and "--run" in res.stderr and not (tmp_path / "q.png").exists()
    res = runwatch("plate", "--out", str(tmp_path / "missing" / "p.png"), cwd=tmp_path)
    assert res.returncode == 2 and "--out" in res.stderr
    res = runwatch("plate", "--prometheus", "http://127.0.0.1:1", "--out", str(tmp_path / "p.png"), cwd=tmp_path)
    assert res.returncode == 2 and "--prometheus" in res.stderr


CLUSTER_TITLES = {p.build().title for p in generator().cluster_panels()}


@pytest.fixture(scope="module")
def crashed_cluster(tmp_path_factory):
    """A 4-rank run whose rank's GPU falls off the bus, written offline as the backtest writes it
    (every rank's series, its GPU's and the launcher's, through the teardown and the restart),
    backfilled with promtool and served by a real Prometheus."""
    tmp = tmp_path_factory.mktemp("cluster")
    cfg = TrainConfig(ranks=4, incident="rank_crash", seed=101, onset=60, steps=160)
    run = simulate(cfg)
    with open(tmp / "run.om", "w") as fh:
        write_openmetrics([run], fh)
    res = subprocess.run([need("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(tmp / "run.om"),
                          str(tmp / "data")], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr
    port = free_port()
    (tmp / "prometheus.yml").write_text("global: {}\n")
    argv = prometheus_argv(need("prometheus"), tmp / "prometheus.yml", tmp / "data", port,
                           "--storage.tsdb.retention.time=100y", "--query.lookback-delta=3s")  # fmt: skip
    with Process(argv, f"http://127.0.0.1:{port}/-/ready", tmp / "prometheus.log"):
        yield cfg, run, f"http://127.0.0.1:{port}"


@pytest.mark.integration
def test_the_cluster_row_reads_every_rank_gpu_and_restart(crashed_cluster):
    """Every query of the cluster row returns series for a cluster run, each rank's or GPU's
    apart, and says what happened: one restart, the steps it lost, the XID that caused it."""
    cfg, run, base = crashed_cluster
    fault = fault_of(cfg)
    results = {
        (q.title, q.ref): dq.run(base, q, {"run": cfg.label}, run.start, run.end_time())
        for q in dq.queries(dq.load(DASHBOARDS / "watching-a-run.json"))
        if q.title in CLUSTER_TITLES
    }
    assert {t for t, _ in results} == CLUSTER_TITLES
    for (title, ref), series in results.items():
        assert series, (title, ref)
        if title not in ("Restarts, steps lost, ETTR",):
            assert len(series) == 4, (title, [s["metric"] for s in series])  # one a rank, or a GPU
    last = {ref: float(s[0]["values"][-1][1]) for (t, ref), s in results.items() if t == "Restarts, steps lost, ETTR"}
    assert last["A"] == 1 and last["B"] == fault.step - (checkpoint_before(cfg, fault.step - 1) + 1)
    assert 0 < last["C"] < 1
    xids = {s["metric"]["Hostname"] + "/" + s["metric"]["gpu"]: {float(v) for _, v in s["values"]}
            for s in results[("GPU XID errors", "A")]}  # fmt: skip
    struck = f"{node_of(cfg, fault.rank)}/{gpu_index(cfg, fault.rank)}"
    assert xids[struck] == {0.0, 79.0} and all(v == {0.0} for k, v in xids.items() if k != struck)


@pytest.mark.integration
def test_the_console_shows_each_rank_through_the_same_queries(crashed_cluster):
    """The console's cluster view (/api/ranks) reads the dashboard's cluster-row queries: at the
    end of the crashed run, every rank and its GPU and the job's restart; during the crash, the
    struck GPU's XID 79."""
    cfg, run, base = crashed_cluster
    fault = fault_of(cfg)
    sources = Sources(base, base, base)  # only Prometheus is read
    end = sources.ranks(cfg.label, now=run.end_time() + 1)  # the last sample, stamped to the ms
    assert [(r["rank"], r["node"]) for r in end["ranks"]] == [(str(r), node_of(cfg, r)) for r in range(4)]
    assert all(r["xid"] == 0 and r["clock"] == NOMINAL_SM_MHZ and r["seq"] == cfg.steps for r in end["ranks"])
    assert end["job"]["restarts"] == 1 and end["job"]["lost"] == fault.step - (
        checkpoint_before(cfg, fault.step - 1) + 1
    )
    stall = next(i for i, s in enumerate(run.samples) if s.state == "stall")
    # Grafana's range ends on a whole step, as dq.run's does: a second on, still in the stall
    during = sources.ranks(cfg.label, now=float(run.stamps()[stall]) + 1)
    assert {r["rank"]: r["xid"] for r in during["ranks"]} == {str(r): 79 if r == fault.rank else 0 for r in range(4)}
    assert sources.ranks("no-such-run", now=run.end_time()) == {"ranks": [], "job": {}}


def test_each_curve_of_a_fixed_meaning_has_its_colour_everywhere_grafana_draws_it():
    """Issue 36, item 3: the expected curve was dashed red in Grafana (a threshold's look), green in
    the postmortem and grey in the console; the 5-step mean red or green by its panel's other curves.
    Every curve whose legend has a meaning (runwatch.readouts.colours) is that colour in Grafana."""
    from runwatch.readouts import colours

    dash = json.loads((DASHBOARDS / "watching-a-run.json").read_text())
    panels = [p for row in dash["panels"] for p in [row, *row.get("panels", [])]]
    checked = 0
    for panel in panels:
        overrides = {o["matcher"]["options"]: o["properties"] for o in panel.get("fieldConfig", {}).get("overrides", [])
                     if o["matcher"]["id"] == "byName"}  # fmt: skip
        for target in panel.get("targets", []):
            legend = target.get("legendFormat", "")
            if panel.get("type") != "timeseries" and panel.get("type") != "trend" or colours.colour(legend) is None:
                continue
            found = {p["id"]: p["value"] for p in overrides.get(legend, [])}
            where = (panel["title"], legend)
            assert found.get("color") == {"mode": "fixed", "fixedColor": colours.colour(legend)}, where
            assert ("custom.lineStyle" in found) == colours.dashed(legend), where
            checked += 1
    assert checked >= 12, checked  # the loss panels' five curves twice, and every threshold line


@pytest.mark.integration
def test_the_console_draws_each_rank_over_time_through_the_dashboard_s_queries(crashed_cluster):
    """Issue 36, item 3: the cluster's rank table was a snapshot. /api/rank_history gives each
    rank's step time and collective wait over time, one curve a rank; no alert fires in this
    Prometheus (it holds no rules), so no rank is drawn as the odd one."""
    cfg, run, base = crashed_cluster
    found = Sources(base, base, base).rank_history(cfg.label, now=run.end_time() + 1)
    for key in ("steptime", "wait", "compute"):
        history = found["history"][key]
        assert [s["label"] for s in history["series"]] == [f"rank {r}" for r in range(4)], key
        assert len(history["times"]) > 20 and all(sum(v is not None for v in s["values"]) > 20
                                                 for s in history["series"]), key  # fmt: skip
    assert found["odd"] == []
    empty = {k: {"times": [], "series": []} for k in ("steptime", "wait", "compute")}
    assert Sources(base, base, base).rank_history("no-such-run", now=run.end_time()) == {"history": empty, "odd": []}


@pytest.mark.integration
def test_the_rank_a_firing_alert_names_is_the_odd_one(tmp_path):
    """The odd rank is the one Prometheus's ALERTS names, firing, for the run: here a straggler's
    rank, with a StragglerRank series of ALERTS written beside its run (as Prometheus records it)."""
    cfg = TrainConfig(ranks=4, incident="straggler", seed=101, onset=30, steps=60)
    run = simulate(cfg)
    slow = struck_rank(cfg)
    with open(tmp_path / "run.om", "w") as fh:
        write_openmetrics([run], fh)
    text = (tmp_path / "run.om").read_text().removesuffix("# EOF\n")
    labels = f'alertname="StragglerRank",alertstate="firing",rank="{slow}",run_id="{cfg.label}",severity="page"'
    stamps = [float(t) for t in run.stamps() if float(t) >= float(run.stamps()[-1]) - 20]
    text += "# TYPE ALERTS gauge\n" + "".join(f"ALERTS{{{labels}}} 1 {t}\n" for t in stamps) + "# EOF\n"
    (tmp_path / "run.om").write_text(text)
    res = subprocess.run([need("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(tmp_path / "run.om"),
                          str(tmp_path / "data")], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr
    port = free_port()
    (tmp_path / "prometheus.yml").write_text("global: {}\n")
    argv = prometheus_argv(need("prometheus"), tmp_path / "prometheus.yml", tmp_path / "data", port,
                           "--storage.tsdb.retention.time=100y", "--query.lookback-delta=3s")  # fmt: skip
    with Process(argv, f"http://127.0.0.1:{port}/-/ready", tmp_path / "prometheus.log"):
        base = f"http://127.0.0.1:{port}"
        found = Sources(base, base, base).rank_history(cfg.label, now=stamps[-1])
    assert found["odd"] == [str(slow)]
    assert len(found["history"]["steptime"]["series"]) == 4
