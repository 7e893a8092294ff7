"""cluster.yml at scale: a simulated fleet of N ranks (runwatch.cluster.fleet), scraped as node targets
by one Prometheus or by hashmod-sharded agents remote-writing to a receiver, through Alertmanager
(alertmanager/alertmanager.yml) to the pager.

    python benchmarks/bench_scale.py --ranks 512 [--topology sharded] [--scrape 5] [--eval 1] [--healthy 120]
    python benchmarks/bench_scale.py --ranks 64,512,4096 --out bench_scale.json
    python benchmarks/bench_scale.py --ranks 4096 --healthy 3600 --faults none   # the soak: an hour, no fault

For each N, after the rules have every rank's history: a healthy stretch (every page in it is a
false page), then each fault `--repeats` times on a random rank, timed from the fleet's onset to
the pager storing the page that names the rank (or node, GPU, run). Meanwhile Prometheus's own
metrics give each rule group's last evaluation time and missed iterations, and psutil the RSS
and CPU of every server we started. Prints one table per N, then the fitted growth with N.

The fleet only injects faults and says when; what pages is decided by cluster.yml alone.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import psutil
import requests
from prometheus_client.parser import text_string_to_metric_families

from runwatch.cluster.fleet import RANKS_PER_NODE
from runwatch.cluster.fleet_lab import CLUSTER_RULES, FleetLab
from runwatch.core.names import PORTS
from runwatch.core.paths import REPO
from runwatch.lab.render import loopback
from runwatch.oncall.page_log import read_pages
from runwatch.oncall.records import received_time
from runwatch.prom.server import Process, free_port
from runwatch.prom.tools import alertmanager_launch, binary

# fault -> (the alert it must page, the labels that must name it, the alert's for: in seconds)
FAULTS = {
    "straggler": ("StragglerRank", ("rank", "node"), 5),
    "throttle": ("GPUThermalThrottle", ("Hostname", "gpu"), 10),
    "rank_down": ("RankDown", ("rank", "node"), 10),
    "node_down": ("RankDown", ("node",), 10),  # its eight ranks at once: the first page naming the node
    "xid": ("GPUXidError", ("Hostname", "gpu"), 0),
    "hang": ("TrainingStalled", ("run_id",), 0),
    "restart": ("JobRestarted", ("run_id",), 0),
}
RUN_ID = "fleet"


def expected_labels(kind: str, rank: int) -> dict[str, str]:
    node = f"node{rank // RANKS_PER_NODE}"
    every = {"rank": str(rank), "node": node, "Hostname": node, "gpu": str(rank % RANKS_PER_NODE), "run_id": RUN_ID}
    return {k: every[k] for k in FAULTS[kind][1]}


def floor_s(kind: str, scrape_s: float, eval_s: float) -> float:
    """The issue's floor at its worst: a fault is seen up to one scrape after its onset, fires
    `for:` and up to one evaluation later, and waits group_wait (0 s for pages, 5 s for warnings).
    StragglerRank's median turns once more than half its 30 s window is slow, TrainingStalled once
    the last step is 10 s old. Delivery to the pager is not in it."""
    alert, _, for_s = FAULTS[kind]
    extra = {"StragglerRank": 15.0, "TrainingStalled": 10.0}.get(alert, 0.0)
    wait = 5.0 if alert in ("GPUThermalThrottle", "JobRestarted") else 0.0
    return scrape_s + extra + for_s + eval_s + wait


class Sampler:
    """Every `every` seconds: each rule group's last duration and missed iterations at the rules
    server, samples appended, and the RSS and CPU of the servers."""

    def __init__(self, lab: FleetLab, every: float = 5.0):
        self.lab, self.every, self.rows, self.stop = lab, every, [], threading.Event()
        self.errors: list[str] = []
        self.procs = {n: psutil.Process(s.proc.pid) for n, s in lab.servers.items()}
        for p in self.procs.values():
            p.cpu_percent()

    def run(self) -> None:
        while not self.stop.wait(self.every):
            try:
                self.rows.append(self.sample())
            except (requests.RequestException, ValueError) as e:  # a busy server's odd answer: one sample lost
                self.errors.append(f"{time.strftime('%H:%M:%S')} {type(e).__name__}: {e}")

    def sample(self) -> dict:
        text = requests.get(f"{self.lab.rules_url}/metrics", timeout=10).text
        row = {"t": time.time(), "groups": {}, "missed": {}, "appended": 0.0}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                group = s.labels.get("rule_group", "").rsplit(";", 1)[-1]
                if s.name == "prometheus_rule_group_last_duration_seconds":
                    row["groups"][group] = s.value
                elif s.name == "prometheus_rule_group_iterations_missed_total":
                    row["missed"][group] = s.value
                elif s.name == "prometheus_tsdb_head_samples_appended_total":
                    row["appended"] += s.value
        groups = requests.get(f"{self.lab.rules_url}/api/v1/rules", timeout=10).json()["data"]["groups"]
        row["rules"] = {r["name"]: r["evaluationTime"] for g in groups for r in g["rules"]}
        row["rss"] = {n: p.memory_info().rss for n, p in self.procs.items()}
        row["cpu"] = {n: p.cpu_percent() / 100 for n, p in self.procs.items()}
        return row


def start_pager(stack: ExitStack, state: Path) -> tuple[str, Path]:
    port, log = free_port(), state / "pages.jsonl"
    argv = [sys.executable, "-m", "runwatch", "pager-serve", "--port", str(port), "--log", str(log)]
    stack.enter_context(Process(argv, f"http://127.0.0.1:{port}/-/ready", state / "pager.log"))
    return f"http://127.0.0.1:{port}", log


def start_alertmanager(stack: ExitStack, state: Path, pager: str) -> str:
    """The repository's alertmanager.yml, its pager at our pager's address."""
    port = free_port()
    config = state / "alertmanager.yml"
    config.write_text(loopback((REPO / "alertmanager" / "alertmanager.yml").read_text(),
                               {**PORTS, "pager": int(pager.rsplit(":", 1)[1])}))  # fmt: skip
    am = binary("alertmanager")
    argv = [*alertmanager_launch(am), am, f"--config.file={config}", f"--storage.path={state / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="]  # fmt: skip
    stack.enter_context(Process(argv, f"http://127.0.0.1:{port}/-/ready", state / "alertmanager.log"))
    return f"http://127.0.0.1:{port}"


def query(lab: FleetLab, expr: str) -> list[dict]:
    return requests.get(f"{lab.rules_url}/api/v1/query", params={"query": expr}, timeout=30).json()["data"]["result"]


def wait_until(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := pred():
            return value
        time.sleep(0.2)
    raise SystemExit(f"bench_scale: timed out after {timeout:g} s waiting for {what}")


def history(lab: FleetLab, ranks: int, timeout: float) -> None:
    """Until every rank has its median and every GPU its recorded 10-minute peak."""
    for rule in ("rank:runwatch_rank_last_compute_seconds:median30s", "gpu:dcgm_fi_dev_sm_clock:max10m"):
        said = [time.monotonic()]

        def full(rule=rule, said=said) -> bool:
            got = query(lab, f"count({rule})")
            have = int(float(got[0]["value"][1])) if got else 0
            if time.monotonic() - said[0] > 30:  # a slow start says how far it has got
                up = query(lab, 'count(up{job="nodes"} == 1)')
                print(f"  history: {have} of {ranks} ranks have {rule}; {up[0]['value'][1] if up else 0} nodes up",
                      flush=True)  # fmt: skip
                said[0] = time.monotonic()
            return have >= ranks

        wait_until(full, timeout, rule)


def healthy(log: Path, since: float, seconds: float, sampler: Sampler) -> None:
    """Sleep through the healthy stretch, with one line a minute: pages so far (every one false)
    and the cluster group's last time, so that a soak's log says when anything went wrong."""
    end = since + seconds
    while (left := end - time.time()) > 0:
        time.sleep(min(60.0, left))
        pages = [p for p in read_pages(log) if p["status"] == "firing" and (received_time(p) or 0) >= since]
        last = sampler.rows[-1]["groups"] if sampler.rows else {}
        times = ", ".join(f"{g} {1000 * v:.0f} ms" for g, v in sorted(last.items()))
        alerts = f" {sorted({p['alert'] for p in pages})}" if pages else ""
        print(f"  healthy {time.time() - since:6.0f} s: {len(pages)} false page(s){alerts}; last {times}", flush=True)


def page_for(log: Path, alert: str, labels: dict[str, str], after: float) -> float | None:
    for p in read_pages(log):
        if p["alert"] == alert and p["status"] == "firing" and all(p["labels"].get(k) == v for k, v in labels.items()):
            at = received_time(p)
            if at is not None and at >= after:
                return at
    return None


def faults(lab: FleetLab, log: Path, args: argparse.Namespace, rng: random.Random) -> dict:
    """Each fault `--repeats` times on a random rank (a new one each time): seconds from onset to page."""
    kinds, repeats, timeout = args.faults, args.repeats, args.fault_timeout
    out: dict[str, list[float]] = {k: [] for k in kinds}
    for kind in kinds:
        alert = FAULTS[kind][0]
        for _ in range(1 if kind == "restart" else repeats):  # JobRestarted fires on for 5 minutes
            rank = rng.randrange(lab.ranks)
            onset = lab.fault(kind, rank, **({"slowdown": args.slowdown} if kind == "straggler" else {}))
            named = expected_labels(kind, rank)
            try:
                at = wait_until(lambda a=alert, n=named, o=onset: page_for(log, a, n, o), timeout,
                                f"{alert} for {kind} on rank {rank}")  # fmt: skip
            except SystemExit:  # no page: counted as a miss, and the next fault is still measured
                out.setdefault(f"{kind} missed", []).append(timeout)
                print(f"  {kind:9} rank {rank:5}: no {alert} page within {timeout:g} s", flush=True)
                lab.fault("heal")
                continue
            out[kind].append(at - onset)
            print(f"  {kind:9} rank {rank:5}: {alert} paged after {at - onset:5.1f} s", flush=True)
            if kind in ("hang", "rank_down", "node_down"):  # the run steps again before the next one
                lab.fault("heal")
                if kind == "hang":
                    wait_until(lambda a=alert: not [f for f in lab.firing() if f["alertname"] == a], timeout,
                               f"{alert} to resolve")  # fmt: skip
            elif kind != "restart":
                lab.fault("heal")
    lab.fault("heal")
    return out


def rule_costs(lab: FleetLab, rules: Path, eval_s: float, repeats: int = 5) -> dict:
    """Each 1 s group's cost a cycle apart from waiting for a core: every rule's expression run
    `repeats` times through the query API with stats=all. The samples a rule touches do not
    depend on the machine's load; the least of its evaluation times is the nearest this machine
    comes to an uncontended one. Summed over the group's rules."""
    import yaml

    out = {}
    for group in yaml.safe_load(rules.read_text())["groups"]:
        if group.get("interval") not in ("1s", f"{eval_s:g}s"):
            continue
        samples, best = 0, 0.0
        for rule in group["rules"]:
            times = []
            for _ in range(repeats):
                resp = requests.get(f"{lab.rules_url}/api/v1/query", params={"query": rule["expr"], "stats": "all"},
                                    timeout=60).json()["data"]["stats"]  # fmt: skip
                times.append(resp["timings"]["evalTotalTime"])
            samples += resp["samples"]["totalQueryableSamples"]
            best += min(times)
        out[group["name"]] = {"samples": samples, "best_ms": 1000 * best}
    return out


def percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def summarise(rows: list[dict], healthy_from: float, healthy_to: float) -> dict:
    """Costs over the run: each group's median and max last duration (wall time: on a shared machine
    the max is mostly waiting for a core), missed iterations, samples
    appended a second, the servers' peak RSS and mean CPU (cores)."""
    groups = sorted({g for r in rows for g in r["groups"]})
    span = rows[-1]["t"] - rows[0]["t"]
    servers = sorted(rows[0]["rss"])
    return {
        "groups": {g: {"median_ms": 1000 * statistics.median(r["groups"][g] for r in rows if g in r["groups"]),
                       "max_ms": 1000 * max(r["groups"][g] for r in rows if g in r["groups"]),
                       "missed": rows[-1]["missed"].get(g, 0) - rows[0]["missed"].get(g, 0)} for g in groups},
        "rules_ms": {n: 1000 * statistics.median(r["rules"][n] for r in rows) for n in rows[-1]["rules"]},
        "samples_per_s": (rows[-1]["appended"] - rows[0]["appended"]) / span,
        "rss_mib": {s: max(r["rss"][s] for r in rows) / 2**20 for s in servers},
        "cpu_cores": {s: statistics.fmean(r["cpu"][s] for r in rows[1:]) for s in servers},
        "healthy_s": healthy_to - healthy_from,
    }  # fmt: skip


def rules_at(state: Path, eval_s: float, source: Path = CLUSTER_RULES) -> Path:
    """cluster.yml with its groups paced at the lab's 1 s evaluated every eval_s instead, as the
    chart's fleet.evaluationInterval renders it: a copy for this run only, every rule as it is."""
    import yaml

    doc = yaml.safe_load(source.read_text())
    for group in doc["groups"]:
        if group.get("interval") == "1s":
            group["interval"] = f"{eval_s:g}s"
    path = state / "cluster.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=200))
    return path


def one_n(args: argparse.Namespace, ranks: int, state: Path) -> dict:
    rng = random.Random(ranks)
    with ExitStack() as stack:
        pager, log = start_pager(stack, state)
        am = start_alertmanager(stack, state, pager)
        rules = [args.rules if args.eval == 1 else rules_at(state, args.eval, args.rules)]
        lab = stack.enter_context(FleetLab(state / "fleet", binary("prometheus"), ranks=ranks, scrape_s=args.scrape,
                                           eval_s=args.eval, topology=args.topology, shards=args.shards,
                                           rules=rules, alertmanager=am))  # fmt: skip
        sampler = Sampler(lab)
        thread = threading.Thread(target=sampler.run, daemon=True)
        thread.start()
        # runwatch-cluster-10m evaluates every 30 s: its first record within one interval, and a scrape;
        # a server busy with other work takes longer to scrape every node (--history-timeout)
        history(lab, ranks, args.history_timeout)
        print(f"{ranks} ranks ({args.topology}): history in; healthy for {args.healthy:g} s", flush=True)
        healthy_from = time.time()
        healthy(log, healthy_from, args.healthy, sampler)
        healthy_to = time.time()
        false_pages = [p for p in read_pages(log) if p["status"] == "firing"
                       and healthy_from <= (received_time(p) or 0) <= healthy_to]  # fmt: skip
        latencies = faults(lab, log, args, rng)
        costs_apart = rule_costs(lab, rules[0], args.eval)
        pages = [p for p in read_pages(log) if p["status"] == "firing" and (received_time(p) or 0) > healthy_to]
        sampler.stop.set()
        thread.join()
        for line in sampler.errors:
            print(f"  sampler: {line}", flush=True)
    costs = summarise(sampler.rows, healthy_from, healthy_to)
    return {"ranks": ranks, "topology": args.topology, "scrape_s": args.scrape, "eval_s": args.eval,
            "slowdown": args.slowdown,
            "latency_s": latencies,
            "false_pages": len(false_pages), "false_page_alerts": sorted({p["alert"] for p in false_pages}),
            "pages_after_healthy": len(pages), "rule_costs": costs_apart, **costs}  # fmt: skip


def table(r: dict, scrape_s: float, eval_s: float) -> str:
    lines = [f"### {r['ranks']} ranks, {r['topology']}, scrape {scrape_s:g} s, 1 s groups every {eval_s:g} s",
             ""]  # fmt: skip
    if r["latency_s"]:  # a soak (--faults none) has no fault to time
        lines += ["| fault | alert | p50 s | p95 s | n | bound s |", "|---|---|---|---|---|---|"]
    for kind, xs in r["latency_s"].items():
        if kind.endswith(" missed"):
            lines.append(f"| {kind} | no page within {xs[0]:g} s | | | {len(xs)} | |")
            continue
        name = f"straggler x{r['slowdown']:.2f}" if kind == "straggler" else kind
        lines.append(f"| {name} | {FAULTS[kind][0]} | {percentile(xs, 50):.1f} | {percentile(xs, 95):.1f} | {len(xs)} "
                     f"| {floor_s(kind, scrape_s, eval_s):.0f} |")  # fmt: skip
    lines += ["", f"False pages over {r['healthy_s']:.0f} s healthy: {r['false_pages']} "
              f"{r['false_page_alerts'] or ''}", f"Samples appended: {r['samples_per_s']:.0f}/s", "",
              "| rule group | median ms | max ms | missed |", "|---|---|---|---|"]  # fmt: skip
    for g, v in r["groups"].items():
        lines.append(f"| {g} | {v['median_ms']:.0f} | {v['max_ms']:.0f} | {v['missed']:g} |")
    if r.get("rule_costs"):
        lines += ["", "Apart from waiting (each rule run 5 times by the query API, stats=all):", "",
                  "| rule group | samples a cycle | least eval ms a cycle |", "|---|---|---|"]  # fmt: skip
        for g, v in r["rule_costs"].items():
            lines.append(f"| {g} | {v['samples']:,} | {v['best_ms']:.1f} |")
    slowest = sorted(r["rules_ms"].items(), key=lambda kv: -kv[1])[:5]
    lines += ["", "Slowest rules (median ms): " + ", ".join(f"{n} {ms:.0f}" for n, ms in slowest)]
    lines += ["", "| server | peak RSS MiB | mean CPU cores |", "|---|---|---|"]
    for s in r["rss_mib"]:
        lines.append(f"| {s} | {r['rss_mib'][s]:.0f} | {r['cpu_cores'][s]:.2f} |")
    return "\n".join(lines)


def growth(results: list[dict]) -> str:
    """Least-squares slopes with N of the slowest 1 s cluster group's median time and the rules
    server's RSS, and the N at which that group's time would reach its 1 s interval."""
    if len(results) < 2:
        return ""
    n = np.array([r["ranks"] for r in results], dtype=float)
    group = np.array([max(v["median_ms"] for g, v in r["groups"].items() if not g.endswith("-10m")) for r in results])
    server = "prometheus" if results[0]["topology"] == "single" else "receiver"
    rss = np.array([r["rss_mib"][server] for r in results])
    (gs, gi), (rs, ri) = np.polyfit(n, group, 1), np.polyfit(n, rss, 1)
    return (
        f"slowest 1 s group: {gs * 1000:.1f} ms per 1,000 ranks (+{gi:.0f} ms); its median reaches 1 s at "
        f"~{(1000 - gi) / gs:,.0f} ranks\n{server} RSS: {rs * 1000:.0f} MiB per 1,000 ranks (+{ri:.0f} MiB); "
        f"1.5 GiB at ~{(1536 - ri) / rs:,.0f} ranks"
    )


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="512", help="ranks, or several comma-separated (multiples of 8)")
    p.add_argument("--topology", choices=["single", "sharded"], default="single")
    p.add_argument("--shards", type=int, default=2, help="agents, when sharded (default 2)")
    p.add_argument("--scrape", type=float, default=5.0, help="scrape interval in seconds (default 5)")
    p.add_argument(
        "--eval",
        type=float,
        default=1.0,
        help="evaluation interval in seconds of cluster.yml's 1 s groups (default cluster.yml's 1)",
    )
    p.add_argument("--healthy", type=float, default=120.0, help="seconds of healthy fleet before the faults")
    p.add_argument("--repeats", type=int, default=3, help="times each fault (restart: once; it fires 5 min)")
    p.add_argument(
        "--slowdown",
        type=float,
        default=1 / 0.7,
        help="a straggler's step time over its own healthy one (default 1/0.7, the lab's)",
    )
    p.add_argument("--faults", default=",".join(FAULTS),
                   help=f"comma-separated, of {', '.join(FAULTS)}; or none: a soak (--healthy 3600)")  # fmt: skip
    p.add_argument("--fault-timeout", type=float, default=120.0, help="seconds to wait for a fault's page")
    p.add_argument("--history-timeout", type=float, default=300.0,
                   help="seconds to wait for every rank's median and every GPU's peak (default 300)")  # fmt: skip
    p.add_argument("--out", type=Path, help="write the results as JSON here too")
    p.add_argument("--rules", type=Path, default=CLUSTER_RULES,
                   help="the rule file (default prometheus/rules/cluster.yml), or another commit's")  # fmt: skip
    args = p.parse_args()
    try:
        args.ranks = [int(x) for x in args.ranks.split(",")]
    except ValueError:
        p.error(f"--ranks: comma-separated integers, got {args.ranks!r}")
    if any(n < RANKS_PER_NODE or n % RANKS_PER_NODE for n in args.ranks):
        p.error(f"--ranks: each a multiple of {RANKS_PER_NODE}, got {args.ranks}")
    args.faults = [] if args.faults == "none" else args.faults.split(",")
    if unknown := set(args.faults) - set(FAULTS):
        p.error(f"--faults: unknown {sorted(unknown)}; known: {', '.join(FAULTS)}")
    return args


def main() -> int:
    args = parse()
    results = []
    for ranks in args.ranks:
        with tempfile.TemporaryDirectory(prefix=f"bench-scale-{ranks}-") as tmp:
            r = one_n(args, ranks, Path(tmp))
        results.append(r)
        print(table(r, args.scrape, args.eval), "\n", flush=True)
    if fit := growth(results):
        print(fit)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
