"""The lab's names and addresses, in one place: the alerts, the components and their ports.

The rule files are the truth for what each alert does; this is the list of their names that
Python needs (the plate's spec, the backtest's report, the dashboards), and tests/test_rules.py
holds it equal to the rule files. Nothing here imports the project.
"""

from __future__ import annotations

# --- alerts, by what they watch (prometheus/rules/alerts.yml, cluster.yml and meta.yml) ---
PLATE_ALERTS = ("TrainingLossJump", "GradientNormJump", "HeldOutGap", "ThroughputDrop")  # the plate's four
LESSON20_ALERTS = ("LossScaleCollapse", "ActivationNormSpike")  # Lesson 20's early warnings
TARGET_ALERTS = ("TrainerDown",)
# one rank of several, and the job's restarts (cluster.yml): first a straggler's, by its rank's
# step time and its GPU's clock
STRAGGLER_ALERTS = ("StragglerRank", "GPUThermalThrottle")
CLUSTER_ALERTS = (*STRAGGLER_ALERTS, "GPUXidError", "TrainingStalled", "RankDown", "JobRestarted")
RANK_ALERTS = STRAGGLER_ALERTS[:1]  # those whose series name the rank they judge
# the alert every other's lead is counted against: the plate's first, TrainingLossJump
LOSS_ALERT = PLATE_ALERTS[0]
META_ALERTS = ("Watchdog", "PagerDown", "AlertmanagerNotificationsFailing", "RuleEvaluationFailing")
# The rule group of the lab's own health: a backtest runs no Alertmanager or pager, so it skips it.
META_GROUP = "runwatch-meta"
# The step at which each alert first fired in each run, recorded once by a rule of alerts.yml:
# every readout (dashboards, `runwatch plate`) reads this one series.
FIRST_FIRED = "run_alert:runwatch_train_step:first_fired"
# The same record for a cluster run, on its ranks' furthest step (cluster.yml)
FIRST_FIRED_RANKS = "run_alert:runwatch_rank_step:first_fired"
# The recording rule that holds each model alert's threshold, one series per alert labelled
# alertname (alerts.yml): the alerts, the dashboards, the console's Rules page and the sweep read it.
THRESHOLD = "alert:runwatch_threshold:ratio"
# `runwatch backtest --from-prometheus --inject`: the incidents it overlays on a recorded run, each
# with the alert the plate pages it with (runwatch.backtest.recorded; the console's Rules page offers them).
RECORDED_INCIDENTS = {"loss_to_chance": "TrainingLossJump", "gradient_spike": "GradientNormJump",
                      "throughput_cut": "ThroughputDrop"}  # fmt: skip
# Recorded while every baseline the plate's four alerts compare with exists for a run
# (baselines.yml): a live trainer holds its incident's onset until it does.
BASELINES_READY = "run:runwatch_baselines:ready"

# --- the lab's clock and its watcher ---
SCRAPE_INTERVAL_S = 1.0  # prometheus/prometheus.yml's scrape_interval (tests/test_rules.py holds them equal)
# A live trainer holds its next step once Prometheus's last scrape of it is older than this:
# three scrapes missed in a row, not a late one (a scrape on a loaded host can be ~0.1 s late).
WATCH_GRACE_S = 3 * SCRAPE_INTERVAL_S

# --- components: each one's port, the same natively (on 127.0.0.1) and published by compose ---
PORTS = {"trainer": 8000, "pager": 9095, "alertmanager": 9093, "prometheus": 9090, "console": 9096}
CONTROL_PORT = 8001  # the healthy control run of `runwatch up --control`
RANK_PORT_BASE = 8100  # rank r of a cluster run serves its own metrics on 8100 + r
LAUNCHER_PORT = 8099  # a cluster run's launcher serves its restarts and ETTR here
LOOPBACK = "127.0.0.1"


def url(component: str) -> str:
    """Where a learner's browser (and every command) reaches a component: http://127.0.0.1:PORT."""
    return f"http://{LOOPBACK}:{PORTS[component]}"


# Runbooks are served by the pager itself, at the address it has in both worlds (natively and
# through compose's published port), so a page's link opens wherever the learner reads it.
RUNBOOK_BASE = f"{url('pager')}/runbooks"
