"""The plate's colours: one per meaning, for every place that draws a run. The console takes them
with the plate's JSON (console/sources.py), the plate PNG and the postmortem's picture from
picture.py, and Grafana from grafana/dashboards.py; tests/test_dashboards.py checks that they agree.

- the expected curve is a model of the loss, not a limit: solid grey, never red or dashed;
- an alert threshold is a limit: dashed red, in every panel;
- the 5-step mean (what TrainingLossJump compares) is purple, whatever else the panel holds.

    >>> colour("alert threshold (TrainingLossJump)")
    '#d62728'
"""

from __future__ import annotations

TRAINING = "#1f77b4"  # blue
HELDOUT = "#ff7f0e"  # orange dots
EXPECTED = "#7f7f7f"  # grey, solid
MEAN = "#9467bd"  # purple
THRESHOLD = "#d62728"  # red, dashed

# a curve's legend (as the dashboards write it) by how it begins -> its colour
BY_LEGEND = (
    ("training loss", TRAINING),
    ("held-out loss", HELDOUT),
    ("expected", EXPECTED),
    ("5-step mean", MEAN),
    ("alert threshold", THRESHOLD),
)


def colour(legend: str) -> str | None:
    """The colour of a curve by its legend; None for one that has no fixed meaning (each rank's)."""
    return next((c for start, c in BY_LEGEND if legend.startswith(start)), None)


def dashed(legend: str) -> bool:
    """Whether a curve is drawn dashed: only a threshold."""
    return legend.startswith("alert threshold")
