"""docs/figures.md is generated: the benchmarks write it through benchmarks/figures.py, and no
hand edits it (issue 38). Each figure names the command that measured it, which exists."""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest

from runwatch.core.paths import REPO

spec = importlib.util.spec_from_file_location("figures", REPO / "benchmarks" / "figures.py")
figures = importlib.util.module_from_spec(spec)
spec.loader.exec_module(figures)


@pytest.mark.unit
def test_figures_md_is_the_rendering_of_figures_json():
    assert (REPO / "docs" / "figures.md").read_text() == figures.render(figures.load()), (
        "docs/figures.md was edited by hand: run `python benchmarks/figures.py render`"
    )


@pytest.mark.unit
def test_every_figure_names_a_command_that_exists_and_when_it_ran():
    records = figures.load()
    assert records
    for key, r in records.items():
        script = re.match(r"(?:python |bash )(\S+)", r["command"])
        target = re.match(r"make (\S+)", r["command"])
        if script:
            assert (REPO / script[1]).is_file(), (key, r["command"])
        elif target:
            assert re.search(rf"^{re.escape(target[1])}:", (REPO / "Makefile").read_text(), re.M), (key, r["command"])
        else:
            assert r["command"].startswith("runwatch "), (key, r["command"])
        assert r["output"].strip() and r["commit"], key
        if not r.get("imported"):
            assert {"date", "seconds", "load_before", "load_after"} <= set(r), key


@pytest.mark.integration
def test_record_keeps_a_benchmarks_summary_and_a_failed_one_records_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(figures, "DATA", tmp_path / "figures.json")
    monkeypatch.setattr(figures, "PAGE", tmp_path / "figures.md")
    failing = [sys.executable, "-c", "print('measuring'); raise SystemExit(3)"]
    assert figures.record("k", "m", failing) == 3
    assert not (tmp_path / "figures.json").exists() and not (tmp_path / "figures.md").exists()
    bench = [
        sys.executable,
        "-c",
        "import sys; print('noise'); print('figure: 1.5 s', flush=True); print('err', file=sys.stderr)",
    ]
    assert figures.record("k", "a measure", bench, keep=r"^figure|^err") == 0
    (kept,) = figures.load().values()
    assert kept["output"] == "figure: 1.5 s\nerr\n" and kept["command"].startswith("python -c ")
    assert (tmp_path / "figures.md").read_text() == figures.render(figures.load())


@pytest.mark.integration
def test_a_record_names_the_commit_its_command_started_at(tmp_path, monkeypatch):
    """A benchmark of an hour runs the code it started with: an edit or a commit made while it
    runs is not what it measured."""
    monkeypatch.setattr(figures, "DATA", tmp_path / "figures.json")
    monkeypatch.setattr(figures, "PAGE", tmp_path / "figures.md")
    edited = tmp_path / "edited"  # the command edits the tree as it runs
    monkeypatch.setattr(figures, "commit", lambda: "def5678+edits" if edited.exists() else "abc1234")
    command = [sys.executable, "-c", f"import pathlib; pathlib.Path({str(edited)!r}).touch(); print('figure')"]
    assert figures.record("k", "m", command) == 0
    assert figures.load()["k"]["commit"] == "abc1234"
