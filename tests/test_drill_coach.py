"""Drills that coach (runwatch.drill.coach): the incident revealed once graded, par times read
from the configuration, and the learner's times beside their own earlier drills.

Unit: the windows follow the trainer's definition of each incident; the par moves when the
configuration it reads moves; the console's plate reveals a drill's window only once drill.json
holds its grade. E2E (a drill lab of its own): the console's /api/plate shades nothing in a
drill until `runwatch diagnose`, then the sealed incident's window, and the grade prints its par.
"""

from __future__ import annotations

import json
import shutil

import pytest
import requests

from runwatch.console.sources import Sources
from runwatch.core.paths import REPO, Layout
from runwatch.drill.coach import READING_WPM, coaching, detection_par, response_par, windows
from runwatch.trainer.config import TrainConfig


@pytest.mark.parametrize(
    "incident, length",
    [("lr_spike", "lr_spike_steps"), ("corrupt_shard", "corrupt_steps"), ("repeated_batch", "repeat_steps")],
)
def test_the_revealed_window_is_the_incident_s_steps_from_its_onset(incident, length):
    last = 271 + getattr(TrainConfig(), length) - 1
    assert windows({"incident": incident, "onset": 271, "seed": 5, "run_id": "drill-1"}) == [[271, last]]


def test_a_slow_node_runs_to_the_end_and_a_healthy_run_reveals_nothing():
    assert windows({"incident": "slow_node", "onset": 333, "seed": 5}) == [[333, TrainConfig().steps - 1]]
    assert windows({"incident": "none", "onset": 300, "seed": 5}) == []


def test_an_answer_that_no_run_could_have_reveals_nothing_rather_than_failing_the_grade():
    assert windows({"incident": "hang", "onset": 300, "seed": 5}, ranks=1) == []  # a fault needs ranks
    assert windows({"incident": "lr_spike", "onset": "soon"}) == []
    assert windows({"incident": "lr_spike"}) == []


def copy_config(tmp_path):
    for d in ("prometheus", "alertmanager", "runbooks"):
        shutil.copytree(REPO / d, tmp_path / d)
    return Layout(tmp_path)


def test_the_detection_par_is_read_from_the_signatures_and_alertmanager_s_group_wait(tmp_path):
    layout = copy_config(tmp_path)
    assert detection_par("corrupt_shard", layout)[0] == 1.0  # at the onset; one 1 s evaluation; group_wait 0 s
    slow, why = detection_par("slow_node", layout)
    assert "ThroughputDrop" in why and "group_wait 5 s" in why
    am = layout.alertmanager_yml
    am.write_text(
        am.read_text().replace(
            "receiver: oncall-ticket\n      group_wait: 5s", "receiver: oncall-ticket\n      group_wait: 20s"
        )
    )
    assert detection_par("slow_node", layout)[0] == pytest.approx(slow + 15)  # a warning's route waits longer
    assert detection_par("corrupt_shard", layout)[0] == 1.0  # a page's route did not move
    assert detection_par("none", layout) is None and detection_par("hang", layout) is None


def test_the_ack_and_diagnosis_pars_are_reading_the_first_page_s_runbook_and_waiting_for_its_signature(tmp_path):
    """Ack at par: the first alert's runbook up to "Which incidents produce it", at READING_WPM;
    diagnosis: on through that section, never before the signature's last alert pages. Edit the
    runbook and the par follows; a healthy run has none."""
    layout = copy_config(tmp_path)
    runbook = layout.runbooks_dir / "HeldOutGap.md"
    head, table = runbook.read_text().split("## Which incidents produce it")
    words = len(head.split()), len(table.split("\n## ")[0].split())
    par = response_par("repeated_batch", layout)
    assert par["ack"][0] == round(words[0] * 60 / READING_WPM, 1)
    assert par["ack"][1] == f"reading {words[0]} words of HeldOutGap's runbook at {READING_WPM} words a minute"
    assert par["diagnosis"][0] == round(par["ack"][0] + words[1] * 60 / READING_WPM, 1)
    runbook.write_text(head + " word" * READING_WPM + "\n## Which incidents produce it" + table)
    assert response_par("repeated_batch", layout)["ack"][0] == pytest.approx(par["ack"][0] + 60, abs=0.1)
    # a runbook of a few words: the diagnosis waits for TrainingLossJump, the signature's last
    # alert, whose window closes 365 - 339 = 26 steps (lab seconds) after HeldOutGap's
    runbook.write_text("# HeldOutGap\n\n## Which incidents produce it\n\nrepeated_batch\n")
    short = response_par("repeated_batch", layout)
    assert short["ack"][0] == 0.5 and short["diagnosis"][0] == 26.0, short
    assert short["diagnosis"][1].startswith("TrainingLossJump pages 26 s after HeldOutGap"), short
    assert response_par("none", layout) is None
    assert response_par("hang", layout)["ack"][1].startswith("reading") and "TrainingStalled" in \
        response_par("hang", layout)["ack"][1]  # fmt: skip


def test_the_grade_s_times_stand_beside_the_par_and_the_learner_s_earlier_drills():
    grade = {"onset": 300, "onset_to_first_page_s": 1.4, "first_page_to_ack_s": 144.2,
             "first_page_to_diagnosis_s": 200.0, "revealed": [[300, 329]]}  # fmt: skip
    earlier = [{"first_page_to_ack_s": 60.0}, {"first_page_to_ack_s": 30.0}, {"first_page_to_ack_s": None}]
    response = {"ack": (39.6, "reading 157 words"), "diagnosis": (77.7, "reading on")}
    lines = coaching(grade, earlier, (1.0, "GradientNormJump by 0 steps after the onset"), response)
    assert lines[0] == "onset -> first page: 1.4 s; par 1.0 s (GradientNormJump by 0 steps after the onset)"
    assert lines[1] == "first page -> ack: 144.2 s; par 39.6 s (reading 157 words); your best 30.0 s, " \
        "median 45.0 s over 2 earlier"  # fmt: skip
    assert lines[2] == "first page -> diagnosis: 200.0 s; par 77.7 s (reading on); your first timed drill"
    assert "steps 300-329" in lines[3]
    healthy = coaching({"onset": None, "onset_to_first_page_s": None}, [], None)
    assert healthy == ["par: none for this incident (a healthy run pages nothing; a fault strikes after the onset)"]


def test_the_console_reveals_a_drill_s_window_only_once_it_is_graded(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    sources = Sources("http://127.0.0.1:1", "http://127.0.0.1:1", "http://127.0.0.1:1", state_dir=state)
    record = {"run_id": "drill-1", "started_at": 0, "acks": [], "diagnosis": None, "ranks": 1}
    (state / "drill.json").write_text(json.dumps(record))
    assert sources.revealed("drill-1") == []  # hidden while the learner works
    record["grade"] = {"revealed": [[287, 291]]}
    (state / "drill.json").write_text(json.dumps(record))
    assert sources.revealed("drill-1") == [[287, 291]]
    assert sources.revealed("another-run") == []
    record["grade"] = {"revealed": [[287, "291"], "x", [1]]}  # hand-edited: nothing drawn from it
    (state / "drill.json").write_text(json.dumps(record))
    assert sources.revealed("drill-1") == []


@pytest.mark.e2e  # a drill lab of its own, diagnosed at once: about 15 s
def test_a_graded_drill_reveals_its_window_on_the_console_s_plate(lab_state, tmp_path):
    from runwatch.core.addresses import lab_url
    from runwatch.lab.supervise import Lab
    from runwatch.trainer.sealed import unseal
    from tests.conftest import runwatch, wait_for
    from tests.test_drill_e2e import drill

    run_id = drill(tmp_path, lab_state, seed=516)  # the tests' key: a corrupt shard from step 247
    console = lab_url(lab_state, "console")

    def plate() -> dict:
        resp = requests.get(f"{console}/api/plate", params={"run": run_id}, timeout=10)
        return resp.json() if resp.status_code == 200 else {}

    # the console knows the run as a drill from its first scrape (run_info's incident="hidden")
    wait_for(lambda: plate().get("drill"), 30, "the console to know the drill's run")
    assert plate()["incident"] == []
    res = runwatch("diagnose", "corrupt_shard", "--step", "247", "--state-dir", str(lab_state), cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "CORRECT" in res.stdout and "par " in res.stdout, res.stdout
    truth = unseal(Lab(lab_state).sealed_answer(run_id))  # where the onset went, were it moved
    assert plate()["incident"] == [[truth["onset"], truth["onset"] + TrainConfig().corrupt_steps - 1]]
    row = requests.get(f"{console}/drills", timeout=10).text  # the console's history of drills
    assert f'data-run="{run_id}" class="ok"' in row and "1/1 diagnosed correctly" in row


def test_a_normal_drill_draws_as_before_easy_never_a_healthy_run_hard_weaker_and_wider():
    import random

    from runwatch.trainer.config import DRILL_ONSET_RANGE, HARD_ONSET_RANGE, SCALED_INCIDENTS, draw_drill

    # the tests' keyed seeds (tests/test_drill_e2e.py) draw what they always drew
    assert draw_drill(random.Random("runwatch-tests:516")) == {"incident": "corrupt_shard", "onset": 247,
                                                               "seed": 1456676160}  # fmt: skip
    assert draw_drill(random.Random("runwatch-tests:42"))["incident"] == "none"
    rng = random.Random(38)
    assert "none" not in {draw_drill(rng, difficulty="easy")["incident"] for _ in range(2000)}
    hard = [draw_drill(rng, difficulty="hard") for _ in range(2000)]
    onsets = [d["onset"] for d in hard]
    assert HARD_ONSET_RANGE[0] <= min(onsets) < DRILL_ONSET_RANGE[0] and DRILL_ONSET_RANGE[1] < max(onsets) <= 450
    strengths = [d["strength"] for d in hard if "strength" in d]
    assert all(d["incident"] in SCALED_INCIDENTS for d in hard if "strength" in d)
    assert len(strengths) > 1500 and 0.3 <= min(strengths) < 0.35 and 0.95 < max(strengths) <= 1.0
    assert not [d for d in hard if d["incident"] in SCALED_INCIDENTS and "strength" not in d]


@pytest.mark.integration
def test_a_hard_drill_s_sealed_strength_is_the_weaker_incident_the_trainer_runs(tmp_path):
    """The sealed answer's strength reaches the trainer: bit for bit the public run of that
    strength, while run.json shows none of it; a strength out of range is one line."""
    from runwatch.trainer.sealed import seal
    from tests.conftest import runwatch

    seal(
        tmp_path / "ans.sealed", {"incident": "lr_spike", "onset": 280, "seed": 9, "run_id": "drill-1", "strength": 0.4}
    )
    sealed = ("--incident", "random", "--sealed-answer", str(tmp_path / "ans.sealed"))
    res = runwatch("train", "--offline", *sealed, "--out", "a.om", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    res = runwatch("train", "--offline", "--incident", "lr_spike:0.4", "--seed", "9", "--onset", "280", "--out", "b.om",
                   cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr

    def losses(name: str) -> list[str]:
        lines = (tmp_path / name).read_text().splitlines()
        return [line.split(" ", 1)[1] for line in lines if line.startswith("runwatch_train_loss{")]

    assert losses("a.om") == losses("b.om") and len(losses("a.om")) == 600
    from runwatch.train import hidden

    assert hidden(TrainConfig(incident="lr_spike", strength=0.4, drill=True)).strength == 1.0  # run.json shows no 0.4
    seal(tmp_path / "bad.sealed", {"incident": "lr_spike", "onset": 280, "seed": 9, "strength": 3})
    res = runwatch("train", "--offline", "--incident", "random", "--sealed-answer", str(tmp_path / "bad.sealed"),
                   "--out", "c.om", cwd=tmp_path)  # fmt: skip
    assert res.returncode == 2 and "holds a strength out of (0, 1]" in res.stderr and res.stderr.count("\n") == 1
    assert not (tmp_path / "c.om").exists()


@pytest.mark.integration
@pytest.mark.parametrize(
    "args, names",
    [(["--difficulty", "extreme"], "argument --difficulty: invalid choice: 'extreme'"),
     (["--difficulty", "hard", "--fast-forward", "150"], "--fast-forward: must be below 150, the earliest onset")],
)  # fmt: skip
def test_a_drill_s_difficulty_refuses_bad_input_in_one_line(tmp_path, args, names):
    from tests.conftest import runwatch

    res = runwatch("drill", *args, "--state-dir", str(tmp_path / "state"), cwd=tmp_path)
    assert res.returncode == 2 and names in res.stderr and res.stderr.count("\n") == 1, res.stderr
    assert not (tmp_path / "state").exists()


@pytest.mark.e2e  # a hard drill lab of its own, diagnosed at once: about 15 s
def test_a_hard_drill_hides_a_weaker_incident_and_its_grade_names_the_strength(lab_state, tmp_path):
    from runwatch.core.addresses import lab_url
    from tests.conftest import runwatch, wait_for
    from tests.test_drill_e2e import DRILL_KEY

    lab_state.mkdir(parents=True)
    (lab_state / "drill.key").write_text(DRILL_KEY + "\n")  # with it, hard seed 5: lr_spike at 0.731 from step 196
    res = runwatch("drill", "--difficulty", "hard", "--seed", "5", "--fast-forward", "100", "--ports", "free",
                   "--state-dir", str(lab_state), cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0 and "started (hard): something may go wrong between steps 150 and 450" in res.stdout
    record = json.loads((lab_state / "drill.json").read_text())
    assert record["difficulty"] == "hard"
    run_json = json.loads((lab_state / "runs" / record["run_id"] / "run.json").read_text())
    assert run_json["config"]["strength"] == 1.0 and run_json["config"]["incident"] == "hidden"
    res = runwatch("diagnose", "lr_spike", "--step", "196", "--state-dir", str(lab_state), cwd=tmp_path)
    assert res.stdout.startswith("CORRECT: you said lr_spike; it was lr_spike at strength 0.731 from step 196."), res
    console = lab_url(lab_state, "console")

    def plate() -> dict:
        resp = requests.get(f"{console}/api/plate", params={"run": record["run_id"]}, timeout=10)
        return resp.json() if resp.status_code == 200 else {}

    # the plate is drawn from the run's first scrape, which the fast-forward of 100 steps precedes
    wait_for(lambda: plate().get("drill"), 30, "the console to draw the drill's plate")
    assert plate()["incident"] == [[196, 196 + TrainConfig().lr_spike_steps - 1]]


@pytest.mark.integration
def test_the_console_s_drills_page_lists_the_graded_drills_newest_first(tmp_path):
    """`runwatch console` over HTTP with a state directory's scoreboard: each grade a row, newest
    first, with its par and the best of each time marked; a torn line is left out, page text is
    escaped; without a state directory (compose's console) the page says none is graded."""
    import subprocess
    import sys

    from runwatch.prom.server import free_port, wait_ready

    first = {"run_id": "drill-1", "incident": "corrupt_shard", "onset": 247, "diagnosed": "corrupt_shard",
             "correct": True, "onset_to_first_page_s": 1.1, "par_onset_to_first_page_s": 1.0,
             "first_page_to_ack_s": 40.0, "first_page_to_diagnosis_s": 90.0, "par_first_page_to_ack_s": 39.6,
             "par_first_page_to_diagnosis_s": 77.7}  # fmt: skip
    second = {"run_id": "drill-<b>2</b>", "incident": "lr_spike", "onset": 247, "strength": 0.731,
              "diagnosed": "none", "correct": False, "onset_to_first_page_s": 1.1, "par_onset_to_first_page_s": 1.0,
              "first_page_to_ack_s": 144.2, "first_page_to_diagnosis_s": 60.0}  # fmt: skip
    state = tmp_path / "state"
    state.mkdir()
    (state / "scoreboard.jsonl").write_text(
        json.dumps(first) + "\n" + '{"run_id": "torn' + "\n" + json.dumps(second) + "\n"
    )
    nowhere, port = f"http://127.0.0.1:{free_port()}", free_port()
    argv = [sys.executable, "-m", "runwatch", "console", "--port", str(port), "--prometheus", nowhere,
            "--alertmanager", nowhere, "--pager", nowhere, "--state-dir", str(state)]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_ready(f"http://127.0.0.1:{port}/-/ready", 30, proc), proc.stderr.read()
        page = requests.get(f"http://127.0.0.1:{port}/drills", timeout=10).text
    finally:
        proc.terminate()
        proc.wait(10)
    assert "1/2 diagnosed correctly" in page and "torn" not in page
    assert page.index('data-run="drill-&lt;b&gt;2&lt;/b&gt;"') < page.index('data-run="drill-1"')  # newest first
    assert "lr_spike at 0.731 from step 247" in page and "<b>2</b>" not in page
    assert "40.0 s (39.6 s) best" in page and "144.2 s (-)</td>" in page and "60.0 s (-) best" in page
    assert "1.1 s (1.0 s)" in page and "90.0 s (77.7 s)</td>" in page  # a grade from before the pars: -


def test_the_postmortem_states_each_time_beside_its_par_and_a_grade_from_before_the_pars_without():
    from runwatch.drill.postmortem import postmortem_markdown

    grade = {"incident": "corrupt_shard", "onset": 247, "diagnosed": "corrupt_shard", "correct": True,
             "first_page": "TrainingLossJump", "onset_to_first_page_s": 1.2, "first_page_to_ack_s": 30.0,
             "first_page_to_diagnosis_s": 60.0, "par_onset_to_first_page_s": 1.0, "par_first_page_to_ack_s": 39.6,
             "par_first_page_to_diagnosis_s": 77.7}  # fmt: skip
    (line,) = [x for x in postmortem_markdown("r", grade, [], "").splitlines() if x.startswith("First page")]
    assert line.endswith(
        "1.2 s (par 1 s); first page to ack: 30 s (par 39.6 s); first page to diagnosis: 60 s (par 77.7 s)."
    )
    old = {k: v for k, v in grade.items() if not k.startswith("par_")}
    assert "par" not in postmortem_markdown("r", old, [], "").split("## What happened")[1].split("\n\n")[1]
