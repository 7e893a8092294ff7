"""runwatch's Grafana dashboards, as code (grafana-foundation-sdk), written to grafana/dashboards/*.json.

    python grafana/dashboards.py          # regenerate the JSON that Grafana provisions

The JSON is committed because Grafana provisions from files; tests/test_dashboards.py fails
if regenerating would change it. Two dashboards:

- "Watching a Run": the plate. Loss (thin) and held-out loss (dots) with the 5-step mean and
  its alert threshold, gradient norm and throughput with theirs, the incident window and firing
  alerts as annotations, the plate's readouts for the selected run, the readouts of every run as
  a table, and what Alertmanager holds now.

Every threshold line is the threshold rule in force (alerts.yml's alert:runwatch_threshold:ratio)
times the alert's baseline, read from Prometheus like any series: edit a threshold, `runwatch
reload`, and the line follows. No number of a rule is copied here.
- "runwatch machinery": scrape durations, rule evaluation time, notifications, pages.

Every panel refers to its datasource by the uid provisioned in grafana/provisioning/.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap, prometheus, stat, table, timeseries, trend
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DashboardSpecialValueMapOptions,
    DataSourceRef,
    DataTransformerConfig,
    DynamicConfigValue,
    SpecialValueMap,
    SpecialValueMatch,
    ValueMap,
    ValueMappingResult,
    VariableRefresh,
    VariableSort,
)

from runwatch.core.names import CLUSTER_ALERTS, FIRST_FIRED, PLATE_ALERTS, TARGET_ALERTS, THRESHOLD, url
from runwatch.readouts import colours

OUT = Path(__file__).with_name("dashboards")
PROMETHEUS = DataSourceRef(type_val="prometheus", uid="runwatch-prometheus")
ALERTMANAGER = DataSourceRef(type_val="alertmanager", uid="runwatch-alertmanager")
ALERTS = PLATE_ALERTS
RUNBOOKS = f"{url('pager')}/runbooks"  # served by the pager (oncall/)
RUN = 'run_id="$run"'


def threshold_line(alert: str, baseline: str) -> str:
    """The alert's threshold in force times its baseline: where the compared ratio reaches it.

    scalar(): the threshold is one number, and multiplying by it keeps the baseline's labels.
    """
    return f'scalar({THRESHOLD}{{alertname="{alert}"}}) * {baseline}{{{RUN}}}'


def threshold_legend(alert: str) -> str:
    """A threshold line's legend; the console and `runwatch plate` dash what starts "alert threshold"."""
    return f"alert threshold ({alert})"


def query(expr: str, legend: str, ref: str, instant: bool = False, table_format: bool = False) -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(PROMETHEUS)
    if instant:
        q = q.instant()
    else:
        q = q.range()
    if table_format:
        q = q.format("table")
    return q


NEVER = -1  # a readout's value for "never fired", shown as a dash
DASH = "—"


def first_fire(alert: str, run_filter: str) -> str:
    """The step at which `alert` first fired, as alerts.yml's rule recorded it when it fired.

    A fact written once, so it reads the same at any time range and in every view (the pages'
    `step` is read at the same evaluation). The record is carried forward at every evaluation,
    so the range only has to reach back to any moment after the alert fired.
    """
    sel = f'alertname="{alert}"' + (f",{run_filter}" if run_filter else "")
    return f"last_over_time({FIRST_FIRED}{{{sel}}}[$__range])"


def readout(alert: str) -> str:
    """first_fire for the selected run, or NEVER: every alert keeps its place on the stat panel."""
    return f"{first_fire(alert, RUN)} or on() vector({NEVER})"


# The loss panels' held-out dots are the samples taken at a step divisible by 10, so they need
# Prometheus's points 1 s apart: a 1 s minimum interval, and enough points for Grafana to keep
# it (it divides the range by maxDataPoints). Prometheus serves at most 11,000 points per
# series, so the dots are all there for ranges up to about 3 hours (docs/limits.md).
DOT_INTERVAL = "1s"
DOT_MAX_POINTS = 11000


def series_panel(title: str, description: str) -> timeseries.Panel:
    return (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(PROMETHEUS)
        .line_width(1)
        .fill_opacity(0)
        .show_points(common.VisibilityMode.NEVER)
        .height(8)
        .span(12)
    )


def fixed(name: str) -> DynamicConfigValue:
    """The curve's colour by its meaning, as the console and the plate PNG draw it (runwatch.readouts.colours)."""
    return DynamicConfigValue(id_val="color", value={"mode": "fixed", "fixedColor": colours.colour(name)})


def points(name: str) -> list[DynamicConfigValue]:
    return [
        DynamicConfigValue(id_val="custom.drawStyle", value="points"),
        DynamicConfigValue(id_val="custom.pointSize", value=6),
        fixed(name),
    ]


def dashed(name: str) -> list[DynamicConfigValue]:
    """A threshold: dashed, in the threshold's red."""
    return [DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}), fixed(name)]


def solid(name: str) -> list[DynamicConfigValue]:
    """A curve of a fixed meaning (the loss, the expected curve, the 5-step mean), solid, in its colour."""
    return [fixed(name)]


def run_variable() -> db.QueryVariable:
    """$run: every run Prometheus holds over the range, the newest first, so it is the default.

    Ordered by each run's start time, as Prometheus sorts them (Grafana keeps the order when the
    variable's sort is disabled). Run ids sort by incident first, so no sort of names would do.
    """
    return (
        db.QueryVariable("run")
        .label("Run")
        .datasource(PROMETHEUS)
        .query(
            "query_result(sort_desc(max by (run_id) (last_over_time(runwatch_train_run_start_time_seconds[$__range]))))"
        )
        .regex('/run_id="([^"]+)"/')
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.DISABLED)
    )


def annotations() -> list[db.AnnotationQuery]:
    """The incident window, checkpoints and firing alerts, marked on every time series."""
    incident = (
        db.AnnotationQuery()
        .name("Incident window")
        .datasource(PROMETHEUS)
        .enable(True)
        .icon_color("rgba(255, 96, 96, 0.35)")
        .expr(f"runwatch_train_incident_active{{{RUN}}} == 1")
    )
    checkpoints = (
        db.AnnotationQuery()
        .name("Checkpoints")
        .datasource(PROMETHEUS)
        .enable(True)
        .icon_color("blue")
        # a new checkpoint step, or the run's first one (a series that was not there 2 s ago)
        .expr(
            f"changes(runwatch_train_checkpoint_step{{{RUN}}}[2s]) > 0"
            f" or (runwatch_train_checkpoint_step{{{RUN}}} unless runwatch_train_checkpoint_step{{{RUN}}} offset 2s)"
        )
    )
    firing = (
        db.AnnotationQuery()
        .name("Firing alerts")
        .datasource(PROMETHEUS)
        .enable(True)
        .icon_color("orange")
        .expr(f'ALERTS{{alertstate="firing",{RUN}}}')
    )
    return [incident, firing, checkpoints]


# A dot where held-out was evaluated (every 10 steps), as on the plate.
HELDOUT_DOTS = f"runwatch_train_heldout_loss{{{RUN}}} and on(run_id) (runwatch_train_step{{{RUN}}} % 10 == 0)"
EXPECTED = "expected (power law fitted to early steps)"
# TrainingLossJump compares the 5-step mean, not each step's loss, with its threshold x the
# 30-step baseline: the line is drawn beside what crosses it. One noisy batch may poke above
# the line on its own; the mean it lifts is what pages.
LOSS_MEAN = "5-step mean (what TrainingLossJump compares)"


def loss_curves(panel: timeseries.Panel | trend.Panel) -> timeseries.Panel | trend.Panel:
    """The plate's loss curves on a panel of either axis: training loss, held-out dots (1 s
    points), the expected curve (solid grey: a model of the loss, not a limit), the 5-step mean
    and TrainingLossJump's threshold line (dashed, red), on a log scale."""
    return (
        panel.with_target(query(f"runwatch_train_loss{{{RUN}}}", "training loss", "A"))
        .with_target(query(HELDOUT_DOTS, "held-out loss", "B"))
        .with_target(query(f"runwatch_train_expected_loss{{{RUN}}}", EXPECTED, "C"))
        .with_target(query(f"run:runwatch_train_loss:avg5s{{{RUN}}}", LOSS_MEAN, "D"))
        .with_target(
            query(
                threshold_line("TrainingLossJump", "run:runwatch_train_loss:avg30s_offset5s"),
                threshold_legend("TrainingLossJump"),
                "E",
            )
        )
        .override_by_name("training loss", solid("training loss"))
        .override_by_name("held-out loss", points("held-out loss"))
        .override_by_name(EXPECTED, solid(EXPECTED))
        .override_by_name(LOSS_MEAN, solid(LOSS_MEAN))
        .override_by_name(threshold_legend("TrainingLossJump"), dashed(threshold_legend("TrainingLossJump")))
        .scale_distribution(cb.ScaleDistributionConfig().type(common.ScaleDistribution.LOG).log(10))
        .unit("none")
        .interval(DOT_INTERVAL)
        .max_data_points(DOT_MAX_POINTS)
    )


def loss_by_step() -> trend.Panel:
    """The plate's loss panel with the plate's x axis: the training step, not wall time.

    Grafana's trend panel draws against a numeric field that increases: the step, joined to
    each curve by time (one row per scrape). A slow node's steps are as wide as a healthy run's
    here, and a restarted run's steps do not stretch across the gap.
    """
    panel = (
        trend.Panel()
        .title("Training loss by step (the plate's x axis)")
        .description(
            "The loss panel against the training step, as the plate draws it: training loss (thin), "
            "held-out loss every 10 steps (dots), the expected curve (grey), and the 5-step mean with "
            "TrainingLossJump's threshold in force x its 30-step baseline (dashed red)."
        )
        .datasource(PROMETHEUS)
        .with_target(query(f"runwatch_train_step{{{RUN}}}", "step", "STEP"))
        .with_transformation(DataTransformerConfig(id_val="joinByField", options={"byField": "Time", "mode": "outer"}))
        .x_field("step")
        # the SDK's trend builder hides the legend, which Grafana shows on a time series by default
        .legend(
            cb.VizLegendOptions()
            .show_legend(True)
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
        )
        .line_width(1)
        .fill_opacity(0)
        .show_points(common.VisibilityMode.NEVER)
        .span_nulls(True)
        .height(8)
        .span(12)
    )
    return loss_curves(panel)


def curves() -> list[timeseries.Panel]:
    """The plate's curves: loss with held-out dots and the expected curve, gradient norm, throughput."""
    loss = loss_curves(
        series_panel(
            "Training loss (thin) and held-out loss (dots)",
            "Training loss of each step's batch, and held-out loss on 400 fixed examples, refreshed every "
            "10 steps. A repeated batch shows as training loss far below held-out. TrainingLossJump fires "
            "when the 5-step mean crosses the dashed line: its threshold in force x the 30-step baseline.",
        )
    )
    grad = (
        series_panel(
            "Gradient norm",
            "L2 norm of each step's gradient, with the GradientNormJump threshold in force (alerts.yml) "
            "x its 60-step running mean.",
        )
        .with_target(query(f"runwatch_train_gradient_norm{{{RUN}}}", "gradient norm", "A"))
        .with_target(
            query(
                threshold_line("GradientNormJump", "run:runwatch_train_gradient_norm:avg60s"),
                threshold_legend("GradientNormJump"),
                "B",
            )
        )
        .override_by_name(threshold_legend("GradientNormJump"), dashed(threshold_legend("GradientNormJump")))
    )
    # Not rate() of the token counter: with 1 s scrapes of ~1 s steps, a window of a few seconds
    # holds 2, 3 or 4 steps, so a healthy run's rate jumps between thirds of a step's tokens
    # (43,690 / 65,536 / 87,381) and reads as a slow node. Each step's own measurement is flat
    # within its 2% jitter; a slow node's 30% drop falls below the dashed alert threshold.
    throughput = (
        series_panel(
            "Throughput (tokens/s per GPU)",
            "Measured for each step (its tokens over its device time), with the ThroughputDrop threshold in "
            "force (alerts.yml) x its 60-step baseline.",
        )
        .with_target(query(f"runwatch_train_tokens_per_second{{{RUN}}}", "per step", "A"))
        .with_target(
            query(
                threshold_line("ThroughputDrop", "run:runwatch_train_tokens_per_second:avg60s_offset5s"),
                threshold_legend("ThroughputDrop"),
                "B",
            )
        )
        .override_by_name(threshold_legend("ThroughputDrop"), dashed(threshold_legend("ThroughputDrop")))
        .unit("short")
    )
    return [loss, loss_by_step(), grad, throughput]


def run_panel() -> stat.Panel:
    """Which run this is, how far it got, and whether and when it ended."""
    when = [DynamicConfigValue(id_val="unit", value="dateTimeAsIso")]
    return (
        stat.Panel()
        .title("Run")
        .description(
            "The selected run's last step in Prometheus, when it started and, once it has finished its last "
            "step, when it ended. A run that stopped without finishing has no end: see TrainerDown."
        )
        .datasource(PROMETHEUS)
        .decimals(0)
        .color_mode(common.BigValueColorMode.NONE)
        .text_mode(common.BigValueTextMode.VALUE_AND_NAME)
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .with_target(query(f"last_over_time(runwatch_train_step{{{RUN}}}[$__range])", "step", "A", instant=True))
        .with_target(
            query(f"last_over_time(runwatch_train_run_start_time_seconds{{{RUN}}}[$__range]) * 1000", "started", "B",
                  instant=True)
        )
        .with_target(
            query(f"last_over_time(runwatch_train_run_end_time_seconds{{{RUN}}}[$__range]) * 1000", "ended", "C",
                  instant=True)
        )
        .override_by_name("started", when)
        .override_by_name("ended", when)
        .height(4)
        .span(12)
    )  # fmt: skip


def readouts_panel() -> stat.Panel:
    """The plate's readouts for the selected run: the step at which each alert first fired."""
    readouts = (
        stat.Panel()
        .title("Readouts: step at which each alert first fired")
        .description(
            "The step each alert first fired at, recorded once by alerts.yml when it fired (the page's step); "
            "'—' never fired."
        )
        .datasource(PROMETHEUS)
        .no_value(DASH)
        .decimals(0)
        .mappings([ValueMap({str(NEVER): ValueMappingResult(text=DASH)})])
        .color_mode(common.BigValueColorMode.NONE)
        .text_mode(common.BigValueTextMode.VALUE_AND_NAME)
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .data_links([db.DashboardLink("Runbook").url(f"{RUNBOOKS}/${{__field.displayName}}.md").target_blank(True)])
        .height(4)
        .span(12)
    )
    for i, alert in enumerate(ALERTS):
        readouts = readouts.with_target(query(readout(alert), alert, chr(65 + i), instant=True))
    return readouts


def every_run_panel() -> table.Panel:
    """The readouts of every run in Prometheus, one row each."""
    every_run = (
        table.Panel()
        .title("Readouts of every run")
        .description("One row per run in Prometheus: the step at which each alert first fired ('—': never).")
        .datasource(PROMETHEUS)
        .no_value(DASH)
        .decimals(0)
        .mappings(
            [
                SpecialValueMap(
                    DashboardSpecialValueMapOptions(
                        match=SpecialValueMatch.NULL_AND_NAN, result=ValueMappingResult(text=DASH)
                    )
                )
            ]
        )
        .height(8)
        .span(12)
        .with_target(
            query(
                "max by (run_id, incident, seed) (last_over_time(runwatch_train_run_info[$__range]))",
                "",
                "RUNS",
                instant=True,
                table_format=True,
            )
        )
        .with_transformation(DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(
            DataTransformerConfig(
                id_val="organize",
                options={
                    "excludeByName": {"Time": True, "Value #RUNS": True},
                    "renameByName": {f"Value #{chr(65 + i)}": alert for i, alert in enumerate(ALERTS)},
                },
            )
        )
    )
    for i, alert in enumerate(ALERTS):
        every_run = every_run.with_target(
            query(f"min by (run_id) ({first_fire(alert, '')})", alert, chr(65 + i), instant=True, table_format=True)
        )
    return every_run


def alert_panels() -> list[db.Panel | stat.Panel]:
    """What is firing now, in Prometheus and in Alertmanager."""
    alert_list = (
        db.Panel()
        .type("alertlist")
        .title("Alerts now")
        .description("Alerts of the Prometheus rules, firing or pending, as Grafana's alert list shows them.")
        .datasource(PROMETHEUS)
        .options(
            {
                "viewMode": "list",
                "groupMode": "default",
                "maxItems": 20,
                "sortOrder": 1,
                "dashboardAlerts": False,
                "alertInstanceLabelFilter": "",
                "datasource": "Prometheus",
                "stateFilter": {"firing": True, "pending": True, "noData": False, "normal": False, "error": True},
            }
        )
        .height(8)
        .span(6)
    )
    alertmanager = (
        stat.Panel()
        .title("Alertmanager holds")
        .description("Alerts in Alertmanager now: active ones page; suppressed ones are silenced (acked) or inhibited.")
        .datasource(PROMETHEUS)
        .no_value("0")
        .with_target(query('sum by (state) (alertmanager_alerts{job="alertmanager"})', "{{state}}", "A", instant=True))
        .height(8)
        .span(6)
    )
    return [alert_list, alertmanager]


def stability_panels() -> list[timeseries.Panel]:
    """Lesson 20's row: loss scale, activation norm, weight norm, skipped steps."""
    return [
        series_panel(
            "Loss scale",
            "The dynamic loss scale of mixed precision (fp16 runs). A crash toward zero "
            "warned OPT-175B's team of trouble; LossScaleCollapse fires at the dashed line: its threshold "
            "in force (alerts.yml) x the last minute's median.",
        )
        .with_target(query(f"runwatch_train_loss_scale{{{RUN}}}", "loss scale", "A"))
        .with_target(
            query(
                threshold_line("LossScaleCollapse", "run:runwatch_train_loss_scale:median60s"),
                threshold_legend("LossScaleCollapse"),
                "B",
            )
        )
        .override_by_name(threshold_legend("LossScaleCollapse"), dashed(threshold_legend("LossScaleCollapse")))
        .scale_distribution(cb.ScaleDistributionConfig().type(common.ScaleDistribution.LOG).log(2))
        .span(6),
        series_panel(
            "Activation norm",
            "L2 norm of the logits, the final layer's activations: batch mean and "
            "largest example. ActivationNormSpike fires when the largest crosses the dashed line: its "
            "threshold in force (alerts.yml) x the largest's 60-step running mean.",
        )
        .with_target(query(f"runwatch_train_logit_norm_mean{{{RUN}}}", "mean", "A"))
        .with_target(query(f"runwatch_train_logit_norm_max{{{RUN}}}", "max", "B"))
        .with_target(
            query(
                threshold_line("ActivationNormSpike", "run:runwatch_train_logit_norm_max:avg60s"),
                threshold_legend("ActivationNormSpike"),
                "C",
            )
        )
        .override_by_name(threshold_legend("ActivationNormSpike"), dashed(threshold_legend("ActivationNormSpike")))
        .span(6),
        series_panel("Weight norm", "L2 norm of all weights and biases.")
        .with_target(query(f"runwatch_train_weight_norm{{{RUN}}}", "weight norm", "A"))
        .span(6),
        series_panel("Skipped steps", "Updates the loss scaler skipped because float16 gradients overflowed.")
        .with_target(query(f"runwatch_train_skipped_steps_total{{{RUN}}}", "skipped steps", "A"))
        .span(6),
    ]


# A GPU's series carry dcgm-exporter's labels, not the run's: they are the run's through the
# rank target that serves them (the same instance).
OF_RUN = f"on (instance) group_left group by (instance) (runwatch_rank_step{{{RUN}}})"
CLUSTER_ROW = "The cluster: ranks, GPUs, restarts (runs with --ranks)"


def cluster_panels() -> list[db.Panel]:
    """The cluster row: per-rank compute time as a heatmap (plate XV.3), step time, collective
    wait and sequence numbers, each GPU's temperature and clock, and the launcher's restarts and
    ETTR. Empty for a one-process run."""
    return [*rank_panels(), *gpu_and_job_panels()]


PER_RANK = "rank {{rank}}"


def rank_panels() -> list[db.Panel]:
    per_rank = PER_RANK
    compute = (
        heatmap.Panel()
        .title("Compute time per rank")
        .description(
            "Plate XV.3: each row a rank, each cell its compute time in one step. A straggler is the one row "
            "that turns hot while the others stay cool; on a slow node every row turns together."
        )
        .datasource(PROMETHEUS)
        .calculate(False)
        .unit("s")
        .with_target(query(f"runwatch_rank_last_compute_seconds{{{RUN}}}", per_rank, "A"))
        .height(8)
        .span(12)
    )
    return [
        compute,
        series_panel("Step time per rank", "Seconds from a rank's step start to the end of its gradient exchange.")
        .unit("s")
        .with_target(query(f"runwatch_rank_last_step_seconds{{{RUN}}}", per_rank, "A"))
        .span(6),
        series_panel(
            "Collective wait per rank",
            "Seconds each rank waited in its last exchange for the slowest: large on the healthy ranks when one "
            "straggles, near zero on the straggler itself.",
        )
        .unit("s")
        .with_target(query(f"runwatch_rank_last_collective_wait_seconds{{{RUN}}}", per_rank, "A"))
        .span(6),
        series_panel(
            "Collective sequence number",
            "The last collective each rank entered (the flight recorder's collective_seq_id). In a hang, one "
            "rank stays one behind while the others wait: `runwatch flight-recorder` names it.",
        )
        .with_target(query(f"runwatch_rank_collective_seq{{{RUN}}}", per_rank, "A"))
        .span(6),
        series_panel("Seconds since each rank's last step", "TrainingStalled pages past 10 s with every rank up.")
        .unit("s")
        .with_target(query(f"time() - runwatch_rank_last_step_timestamp_seconds{{{RUN}}}", per_rank, "A"))
        .span(6),
    ]


def gpu_and_job_panels() -> list[db.Panel]:
    return [
        series_panel(
            "GPU temperature",
            "dcgm-exporter's DCGM_FI_DEV_GPU_TEMP of each rank's GPU. Throttling starts in the high 80s C.",
        )
        .unit("celsius")
        .with_target(query(f"DCGM_FI_DEV_GPU_TEMP * {OF_RUN}", "{{Hostname}} gpu {{gpu}}", "A"))
        .span(6),
        series_panel("GPU SM clock", "DCGM_FI_DEV_SM_CLOCK: a thermally throttled GPU drops below 90% of its peak.")
        .unit("rotmhz")
        .with_target(query(f"DCGM_FI_DEV_SM_CLOCK * {OF_RUN}", "{{Hostname}} gpu {{gpu}}", "A"))
        .span(6),
        series_panel(
            "Restarts, steps lost, ETTR",
            "The launcher's: restarts from the last checkpoint, the steps trained again, and the effective "
            "training time ratio (kept lab time over wall time; Llama 3 kept above 0.9).",
        )
        .with_target(query(f"runwatch_job_restarts_total{{{RUN}}}", "restarts", "A"))
        .with_target(query(f"runwatch_job_lost_steps_total{{{RUN}}}", "steps lost", "B"))
        .with_target(query(f"runwatch_job_ettr{{{RUN}}}", "ETTR", "C"))
        .span(6),
        series_panel("GPU XID errors", "DCGM_FI_DEV_XID_ERRORS: the last XID of each GPU (79, 48, 63), 0 for none.")
        .with_target(query(f"DCGM_FI_DEV_XID_ERRORS * {OF_RUN}", "{{Hostname}} gpu {{gpu}}", "A"))
        .span(6),
    ]


def watching_a_run() -> db.Dashboard:
    dash = (
        db.Dashboard("Watching a Run")
        .uid("runwatch-watching-a-run")
        .description("Plate XV.6: four curves, four alarms, and an incident that shows up in only one of them.")
        .tags(["runwatch", "plate"])
        .time("now-15m", "now")
        .refresh("5s")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .with_variable(run_variable())
    )
    for annotation in annotations():
        dash = dash.annotation(annotation)
    for panel in [run_panel(), *curves(), readouts_panel(), every_run_panel(), *alert_panels()]:
        dash = dash.with_panel(panel)
    dash = dash.with_row(db.Row("Stability (Lesson 20): early warnings, in fp16 runs"))
    for panel in stability_panels():
        dash = dash.with_panel(panel)
    dash = dash.with_row(db.Row(CLUSTER_ROW))
    for panel in cluster_panels():
        dash = dash.with_panel(panel)
    dash = dash.link(db.DashboardLink("runwatch machinery").url("/d/runwatch-machinery"))
    for alert in (*ALERTS, *TARGET_ALERTS, *CLUSTER_ALERTS):
        dash = dash.link(db.DashboardLink(f"Runbook: {alert}").url(f"{RUNBOOKS}/{alert}.md").target_blank(True))
    return dash


def machinery() -> db.Dashboard:
    def panel(title: str, description: str, unit: str, *targets: tuple[str, str]) -> timeseries.Panel:
        p = series_panel(title, description).unit(unit)
        for i, (expr, legend) in enumerate(targets):
            p = p.with_target(query(expr, legend, chr(65 + i)))
        return p

    return (
        db.Dashboard("runwatch machinery")
        .uid("runwatch-machinery")
        .description("The monitoring stack itself: is it scraping, evaluating and paging on time?")
        .tags(["runwatch"])
        .time("now-15m", "now")
        .refresh("5s")
        .with_panel(
            panel("Scrape duration", "How long each target's last scrape took.", "s",
                  ("scrape_duration_seconds", "{{job}} {{instance}}"))
        )
        .with_panel(
            panel("Rule evaluation time", "Duration of each rule group's last evaluation (every 1 s).", "s",
                  ("prometheus_rule_group_last_duration_seconds", "{{rule_group}}"))
        )
        .with_panel(
            panel("Alertmanager notifications", "Notifications sent and failed per second, by integration.", "ops",
                  ("sum by (integration) (rate(alertmanager_notifications_total[$__rate_interval]))",
                   "sent {{integration}}"),
                  ("sum by (integration) (rate(alertmanager_notifications_failed_total[$__rate_interval]))",
                   "failed {{integration}}"))
        )
        .with_panel(
            panel("Pages", "Pages the on-call pager stored, by status, and repeats it dropped.", "short",
                  ("sum by (status) (runwatch_pager_pages_total)", "{{status}}"),
                  ("runwatch_pager_duplicates_total", "duplicates dropped"))
        )
        .with_panel(
            panel("Exporter render time", "Seconds the trainer's exporter took to render /metrics.", "s",
                  ("runwatch_exporter_scrape_duration_seconds", "{{instance}}"))
        )
    )  # fmt: skip


def render() -> dict[str, str]:
    """file name -> JSON text, as committed in grafana/dashboards/."""
    out = {}
    for name, builder in [("watching-a-run.json", watching_a_run()), ("machinery.json", machinery())]:
        model = json.loads(json.dumps(builder.build(), cls=JSONEncoder))
        for ann in model.get("annotations", {}).get("list", []):
            # Fields of Grafana's Prometheus annotation queries that the SDK does not model: a 1 s
            # step (the default 60 s would miss a 5-step incident) and the title of each event.
            if ann.get("datasource", {}).get("type") == "prometheus":
                title = "{{alertname}}" if "ALERTS" in ann["expr"] else ann["name"].lower()
                ann.update({"step": "1s", "titleFormat": title})
        out[name] = json.dumps(model, indent=2, sort_keys=True) + "\n"
    return out


def main() -> int:
    OUT.mkdir(exist_ok=True)
    for name, text in render().items():
        (OUT / name).write_text(text)
        print(f"wrote {OUT / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
