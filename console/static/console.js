// The console's one script: the live plate (uPlot), the pages list, the runbook pane.
// Served from this package; the page allows no other script (Content-Security-Policy).
"use strict";

const REFRESH_MS = 1000; // the plate and the pages follow Prometheus and the pager within ~2 s

const root = document.getElementById("console");
const charts = {};
const state = { plate: null, pagesHtml: "" };
window.runwatchConsole = { charts, state }; // what the browser tests read

const COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"];
const MARKS = ["#9467bd", "#ff7f0e", "#2ca02c", "#8c564b", "#e377c2", "#bcbd22"];

// A curve's colour is its meaning's (the server sends it: runwatch.readouts.colours), the same
// in the plate PNG, the postmortem and Grafana; a curve of no fixed meaning takes the next one.
function seriesStyle(series, i) {
  const label = series.label, colour = series.colour || COLOURS[i % COLOURS.length];
  const s = { label, stroke: colour, width: 1, spanGaps: true };
  if (label === "held-out loss") {
    return { ...s, paths: () => null, points: { show: true, size: 7, fill: colour } };
  }
  // a threshold is dashed; the expected curve is a model of the loss, not a limit: solid
  if (label.startsWith("alert threshold")) {
    return { ...s, dash: [8, 6], points: { show: false } };
  }
  if (label.startsWith("expected")) {
    return { ...s, width: 1.5, points: { show: false } };
  }
  return { ...s, points: { show: false } };
}

const PLATE_PANELS = ["loss", "grad", "throughput", "scale", "norm"]; // console/sources.py's
const STABILITY = ["scale", "norm"]; // Lesson 20's row: a mixed-precision run's; hidden when empty

// The incident window (shaded) and a dotted line where each alert first fired, with its name.
function marksPlugin() {
  return {
    hooks: {
      drawClear: [(u) => {
        const p = state.plate;
        if (!p) return;
        const { ctx, bbox } = u;
        ctx.save();
        ctx.fillStyle = "rgba(255, 0, 0, 0.12)";
        for (const [lo, hi] of p.incident) {
          const x0 = u.valToPos(lo, "x", true), x1 = u.valToPos(hi + 1, "x", true);
          ctx.fillRect(x0, bbox.top, Math.max(x1 - x0, 1), bbox.height);
        }
        ctx.restore();
      }],
      draw: [(u) => {
        const p = state.plate;
        if (!p) return;
        const { ctx, bbox } = u;
        const byStep = {};
        for (const [alert, step] of Object.entries(p.readouts)) {
          if (step !== null) (byStep[step] = byStep[step] || []).push(alert);
        }
        ctx.save();
        ctx.setLineDash([3, 3]);
        ctx.font = `${10 * devicePixelRatio}px sans-serif`;
        // uPlot leaves the context as its last axis drew (right-aligned): a label set from its
        // own left edge must say so, or it ends where it should begin, left of its line
        ctx.textAlign = "left";
        ctx.textBaseline = "alphabetic";
        const gap = 3 * devicePixelRatio;
        Object.entries(byStep).forEach(([step, alerts], i) => {
          const x = u.valToPos(Number(step), "x", true);
          ctx.strokeStyle = ctx.fillStyle = MARKS[i % MARKS.length];
          ctx.beginPath();
          ctx.moveTo(x, bbox.top);
          ctx.lineTo(x, bbox.top + bbox.height);
          ctx.stroke();
          // one line of text per mark, stacked, so marks a step apart stay readable; right of
          // its line, or left of it where the panel's edge would cut it, never past either edge
          const text = `${alerts.join(", ")} ${step}`;
          const width = ctx.measureText(text).width;
          let left = x + gap;
          if (left + width > bbox.left + bbox.width) left = x - gap - width;
          left = Math.max(bbox.left, left);
          ctx.fillText(text, left, bbox.top + (12 + 12 * i) * devicePixelRatio);
        });
        ctx.restore();
      }],
    },
  };
}

function makeChart(key, panel) {
  const el = document.getElementById(`chart-${key}`);
  const opts = {
    width: Math.max(el.clientWidth, 400),
    height: 220,
    scales: { x: { time: false }, y: key === "loss" || key === "scale" ? { distr: 3 } : {} },
    // whole steps on x; room on y for "65,000" tokens/s
    axes: [{ label: "training step", incrs: [1, 2, 5, 10, 20, 25, 50, 100, 200, 500, 1000] }, { size: 70 }],
    series: [{ label: "step" }, ...panel.series.map((s, i) => seriesStyle(s, i))],
    plugins: [marksPlugin()],
  };
  return new uPlot(opts, toData(panel), el);
}

function toData(panel) {
  return [panel.steps, ...panel.series.map((s) => s.values)];
}

function runState(p) {
  if (p.waiting) return "(waiting for the first scrape)";
  const last = p.panels.loss.steps.length ? p.panels.loss.steps[p.panels.loss.steps.length - 1] : p.step;
  const drill = p.drill ? ", a drill" : "";
  if (p.ended) return `(step ${last}, finished ${new Date(p.ended * 1000).toISOString().slice(11, 19)} UTC${drill})`;
  if (p.paused_for) return `(step ${last}, paused: Prometheus has not scraped for ${Math.round(p.paused_for)} s${drill})`;
  // compose's console sees only Prometheus, to which a held trainer and a stopped one look alike
  if (p.stopped && !p.known && p.unseen)
    return `(stopped at step ${last}, or paused: Prometheus has not scraped it for ${Math.round(p.unseen)} s${drill})`;
  if (p.stopped) return `(stopped at step ${last}${drill})`;
  return `(step ${last}, running${drill})`;
}

function showReadouts(p) {
  const parts = Object.entries(p.readouts).map(([a, s]) => `${a} ${s === null ? "\u2014" : s}`);
  document.getElementById("readouts").textContent = parts.join("  \u00b7  ");
  document.getElementById("run-state").textContent = runState(p);
  // no links where Prometheus serves no web UI (Debian's build): a dead page helps no one
  for (const key of ["loss", "grad", "throughput"]) {
    const link = document.getElementById(`link-${key}`);
    link.hidden = !p.links[key];
    if (p.links[key]) link.href = p.links[key];
  }
}

async function refreshPlate() {
  const run = root.dataset.run;
  const problem = document.getElementById("plate-problem");
  try {
    const resp = await fetch(`/api/plate?run=${encodeURIComponent(run)}`);
    const p = await resp.json();
    if (!resp.ok) throw new Error(p.error || resp.statusText);
    problem.hidden = true;
    if (p.waiting) { // the lab's own run, before Prometheus holds a sample of it
      document.getElementById("run-state").textContent = runState(p);
      document.getElementById("readouts").textContent = "\u2014";
      return;
    }
    state.plate = p;
    for (const key of PLATE_PANELS) {
      const panel = p.panels[key];
      if (STABILITY.includes(key)) {
        const empty = !panel || panel.steps.length === 0;
        document.getElementById(`panel-${key}`).hidden = empty;
        if (empty) continue;
      }
      const labels = panel.series.map((s) => s.label).join("|");
      if (!charts[key] || charts[key]._labels !== labels) {
        if (charts[key]) charts[key].destroy();
        charts[key] = makeChart(key, panel);
        charts[key]._labels = labels;
      } else {
        charts[key].setData(toData(panel));
      }
    }
    showReadouts(p);
  } catch (err) {
    problem.textContent = `The plate cannot be drawn now: ${err.message}`;
    problem.hidden = false;
  }
}

// The cluster row: one line a rank, from /api/ranks (the dashboard's cluster-row queries).
// Hidden for a run of one process. Written with textContent only: nothing served is markup.
const RANK_COLUMNS = [["rank", 0], ["node", null], ["compute", 3], ["wait", 3], ["seq", 0], ["since", 1],
  ["temp", 1], ["clock", 0], ["xid", 0]];

async function refreshRanks() {
  const panel = document.getElementById("ranks-panel");
  try {
    const resp = await fetch(`/api/ranks?run=${encodeURIComponent(root.dataset.run)}`);
    const data = await resp.json();
    if (!resp.ok) throw new Error(data.error || resp.statusText);
    const body = document.querySelector("#ranks tbody");
    body.replaceChildren(...data.ranks.map((r) => {
      const tr = document.createElement("tr");
      for (const [key, digits] of RANK_COLUMNS) {
        const td = document.createElement("td");
        const v = r[key];
        td.textContent = v == null ? "-" : (digits == null ? String(v) : Number(v).toFixed(digits));
        if (key === "xid" && Number(v) > 0) td.className = "hot";
        tr.appendChild(td);
      }
      return tr;
    }));
    const j = data.job;
    document.getElementById("job-summary").textContent = j.restarts == null ? "" :
      `(${j.restarts} restart(s), ${j.lost} step(s) lost, ETTR ${j.ettr == null ? "-" : j.ettr.toFixed(2)})`;
    panel.hidden = data.ranks.length === 0;
  } catch (err) {
    panel.hidden = true;
  }
}

// The cluster row over time (/api/rank_history): each rank's step time and collective wait,
// one thin curve a rank; a rank that a firing alert names (Prometheus's ALERTS) drawn thick, red.
const ODD_COLOUR = "#d62728", RANK_COLOUR = "#8aa4c8";

function rankChart(key, h, odd) {
  const el = document.getElementById(`chart-${key}`);
  const series = h.series.map((s) => odd.includes(s.rank)
    ? { label: s.label, stroke: ODD_COLOUR, width: 2.5, spanGaps: true, points: { show: false } }
    : { label: s.label, stroke: RANK_COLOUR, width: 1, spanGaps: true, points: { show: false } });
  const opts = {
    width: Math.max(el.clientWidth, 400), height: 180,
    axes: [{}, { size: 60, label: key === "steptime" ? "step time s" : "collective wait s" }],
    series: [{ label: "time" }, ...series],
  };
  return new uPlot(opts, [h.times, ...h.series.map((s) => s.values)], el);
}

// A heat strip a rank: each moment's compute time over the fastest rank's then, white at 1, red
// at 2 or more: a wide job's odd rank reads as one red strip where twenty curves would tangle.
// (Not step time: every rank of a synchronous job steps as slowly as the slowest.)
const HEAT_ROW = 14, HEAT_LABEL = 60;

function drawHeat(h) {
  const canvas = document.getElementById("heat-compute");
  const width = Math.max(canvas.parentElement.clientWidth, 400);
  canvas.width = width;
  canvas.height = HEAT_ROW * h.series.length;
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const n = h.times.length, cell = (width - HEAT_LABEL) / Math.max(n, 1);
  for (let t = 0; t < n; t++) {
    const now = h.series.map((s) => s.values[t]).filter((v) => v != null && v > 0);
    const fastest = now.length ? Math.min(...now) : null;
    h.series.forEach((s, r) => {
      const v = s.values[t];
      if (v == null || fastest == null) return;
      const slow = Math.min(Math.max(v / fastest - 1, 0), 1); // 0: as fast as the fastest, 1: twice as slow
      const g = Math.round(255 * (1 - slow));
      ctx.fillStyle = `rgb(255, ${g}, ${g})`;
      ctx.fillRect(HEAT_LABEL + t * cell, r * HEAT_ROW, Math.ceil(cell), HEAT_ROW - 1);
    });
  }
  ctx.fillStyle = "#333";
  ctx.font = "11px sans-serif";
  ctx.textBaseline = "middle";
  h.series.forEach((s, r) => ctx.fillText(s.label, 2, r * HEAT_ROW + HEAT_ROW / 2));
}

async function refreshRankHistory() {
  if (document.getElementById("ranks-panel").hidden) return;
  try {
    const resp = await fetch(`/api/rank_history?run=${encodeURIComponent(root.dataset.run)}`);
    const data = await resp.json();
    if (!resp.ok) throw new Error(data.error || resp.statusText);
    if (data.history.compute && data.history.compute.times.length) drawHeat(data.history.compute);
    for (const key of ["steptime", "wait"]) {
      const h = data.history[key];
      if (!h || h.times.length === 0) continue;
      const shape = h.series.map((s) => s.label).join("|") + "/" + data.odd.join(",");
      if (!charts[key] || charts[key]._shape !== shape) { // a rank joined, or an alert names another
        if (charts[key]) charts[key].destroy();
        charts[key] = rankChart(key, h, data.odd);
        charts[key]._shape = shape;
      } else {
        charts[key].setData([h.times, ...h.series.map((s) => s.values)]);
      }
    }
  } catch (err) {
    // the next refresh tries again; the charts keep what they showed
  }
}

async function refreshPages() {
  const box = document.getElementById("pages");
  try {
    const resp = await fetch(`/pages?run=${encodeURIComponent(box.dataset.run)}`);
    const html = await resp.text();
    if (html !== state.pagesHtml) { // replaced only when it changed: no flicker, no lost focus
      state.pagesHtml = html;
      box.innerHTML = html; // rendered and escaped by the server's templates
    }
  } catch (err) {
    // the next refresh tries again; the list keeps what it showed
  }
}

async function showRunbook(alert) {
  const pane = document.getElementById("runbook");
  const resp = await fetch(`/runbook/${encodeURIComponent(alert)}`);
  pane.innerHTML = await resp.text(); // Markdown rendered by the server with raw HTML disabled
  pane.scrollTop = 0;
}

if (root) {
  document.getElementById("pages").addEventListener("click", (ev) => {
    const button = ev.target.closest("button");
    if (!button) return;
    if (button.classList.contains("show-runbook")) showRunbook(button.dataset.alert);
    if (button.classList.contains("ack")) {
      document.getElementById("ack-alert").value = button.dataset.alert;
      document.getElementById("ack-comment").focus();
    }
  });
  const picker = document.getElementById("run-picker");
  picker.addEventListener("change", () => picker.form.submit());
  refreshPlate();
  refreshPages();
  refreshRanks();
  setInterval(refreshPlate, REFRESH_MS);
  setInterval(refreshPages, REFRESH_MS);
  setInterval(refreshRanks, REFRESH_MS);
  setInterval(refreshRankHistory, REFRESH_MS);
}
