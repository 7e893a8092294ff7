"""`runwatch lesson`: the lab guide's lessons, each step checked against the lab's real state.

The lessons' checks are read from docs/lab-guide.md itself. Unit: the guide's blocks parse, a
malformed block is one line naming the file and the step, the command's bad input is one line,
a file check reads the file, and `check --open` checks only the open steps. Integration: every
PromQL check of the guide runs on a real Prometheus; the console's Check and poll take its
token. E2E (slow: a lab of its own for about a minute): on a live corrupt shard, each step is NO
before the action it asks for and OK after it, and progress survives the lab's stop; in
Chromium, lesson 1 and the on-call lesson complete themselves on the Lessons page as the learner
works, each step NO before its action.
"""

from __future__ import annotations

import json

import pytest

from runwatch import cli
from runwatch.core.command import UsageError
from runwatch.core.paths import REPO
from runwatch.lesson import Lab, check, guide_path, read_lessons, read_progress, record_progress

GUIDE = REPO / "docs" / "lab-guide.md"


def test_the_guide_holds_the_lessons_in_order_each_step_with_a_check_and_a_hint():
    lessons = read_lessons(guide_path())
    assert [lesson.number for lesson in lessons] == list(range(1, len(lessons) + 1))
    titles = [lesson.title for lesson in lessons]
    assert titles[0] == "Exercise 1: name the core metrics" and titles[-1] == "Practise on a cluster", titles
    assert "Practise on-call" in titles
    assert all(step.hint and step.kind for lesson in lessons for step in lesson.steps)


GOOD_STEP = "  - step: the trainer is scraped\n    promql: up == 1\n    hint: runwatch up\n"
MALFORMED = {
    "out of order": ("lesson: 2\nsteps:\n" + GOOD_STEP, "lesson 2 (Lesson) is out of order: expected 1"),
    "no steps": ("lesson: 1\nsteps: []\n", "lesson 1 has no steps"),
    "no check": ("lesson: 1\nsteps:\n  - step: s\n    hint: h\n", "step 's': needs exactly one check"),
    "two checks": ("lesson: 1\nsteps:\n  - step: s\n    promql: up\n    file: /x\n    hint: h\n",
                   "step 's': needs exactly one check"),
    "an unknown key": ("lesson: 1\nsteps:\n  - step: s\n    promq: up\n    hint: h\n", "step 's': unknown key 'promq'"),
    "no hint": ("lesson: 1\nsteps:\n  - step: s\n    promql: up\n", "step 's': needs `hint:`"),
    "a pager state": ("lesson: 1\nsteps:\n  - step: s\n    pager: seen\n    hint: h\n",
                      "`pager:` must be paged or acknowledged, got 'seen'"),
    "no objective": ("lesson: 1\nsteps:\n  - promql: up\n    hint: h\n", "each step needs `step:`"),
    "yaml": ("lesson: 1\nsteps: [\n", "a yaml block does not parse"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_lesson_block_is_one_line_naming_the_file_and_step(tmp_path, case):
    block, message = MALFORMED[case]
    guide = tmp_path / "lab-guide.md"
    guide.write_text(f"# Guide\n\n## Lesson\n\n```yaml\n{block}```\n")
    with pytest.raises(UsageError) as err:
        read_lessons(guide)
    assert str(err.value).startswith(f"{guide}: ") and message in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_a_guide_without_lessons_says_so(tmp_path):
    guide = tmp_path / "lab-guide.md"
    guide.write_text("## Example\n\n```yaml\ngroups: []\n```\n")  # a yaml example is not a lesson
    with pytest.raises(UsageError, match="no lesson's checks in it"):
        read_lessons(guide)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["lesson", "check"], "lesson check: which lesson? a number from 1 to 7"),
        (["lesson", "check", "99"], "lesson check: no lesson 99; the lab guide has lessons 1 to 7"),
        (["lesson", "list", "2"], "lesson list takes no number"),
        (["lesson", "check", "two"], "argument number: invalid int value: 'two'"),
        (["lesson", "grade", "2"], "argument action: invalid choice: 'grade'"),
    ],
)
def test_bad_input_to_the_command_is_one_line_with_status_2(capsys, tmp_path, argv, message):
    assert cli.main([*argv, "--state-dir", str(tmp_path / "state")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "state").exists()  # nothing written


def test_damaged_progress_is_one_line_naming_the_file_and_left_as_it_was(capsys, tmp_path):
    (tmp_path / "lessons.json").write_text('{"done": ["not a map"')
    assert cli.main(["lesson", "--state-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'lessons.json'}: the lessons' progress is damaged" in err and err.count("\n") == 1, err
    assert (tmp_path / "lessons.json").read_text() == '{"done": ["not a map"'


def test_progress_only_goes_up(tmp_path):
    assert record_progress(tmp_path, 2, [1, 2]) == [1, 2]
    assert record_progress(tmp_path, 2, [3]) == [1, 2, 3]  # step 1 done before, NO now (another run): still done
    assert read_progress(tmp_path) == {"2": [1, 2, 3]}


def test_a_file_check_passes_only_once_the_file_holds_the_text(tmp_path):
    (step,) = [s for s in read_lessons(GUIDE)[0].steps if s.kind == "file" and "none.om" in str(s.target)]
    lab = Lab(tmp_path / "state", "", tmp_path)
    assert check(step, lab) == (False, f"no {tmp_path / 'none.om'}")
    (tmp_path / "none.om").write_text('runwatch_train_loss{run_id="none-8"} 2.3\n')
    assert check(step, lab)[0] is False  # another seed's run
    (tmp_path / "none.om").write_text('runwatch_train_loss{run_id="none-7"} 2.3\n')
    assert check(step, lab) == (True, str(tmp_path / "none.om"))


def test_check_open_runs_only_the_steps_not_yet_done_and_keeps_the_rest_done(capsys, tmp_path):
    """What the Lessons page polls: `check N --open` checks the open steps only; a step done before
    stays OK unchecked (its file gone since), an open one is checked now, and the JSON names the
    next step for the page's "lesson N of M, step k"."""
    state, nowhere = tmp_path / "state", "http://127.0.0.1:9"  # no lab: its PromQL steps are NO
    state.mkdir()
    argv = ["lesson", "check", "1", "--open", "--json", "--state-dir", str(state), "--tmp-dir", str(tmp_path),
            "--prometheus", nowhere, "--pager", nowhere]  # fmt: skip
    record_progress(state, 1, [1, 4])  # slow.om was trained, and removed since
    assert cli.main(argv) == 1
    found = json.loads(capsys.readouterr().out)
    assert [(s["step"], s["ok"]) for s in found["steps"]] == [(1, True), (2, False), (3, False), (4, True)]
    assert found["steps"][0]["found"] == "done before" and "did not answer" in found["steps"][1]["found"]
    assert found["next"] == {"lesson": 1, "step": 2, "text": found["steps"][1]["text"]}
    (tmp_path / "none.om").write_text('runwatch_train_loss{run_id="none-7"} 2.3\n')
    assert cli.main(argv) == 1
    found = json.loads(capsys.readouterr().out)
    assert [s["ok"] for s in found["steps"]] == [True, False, True, True] and found["done_ever"] == [1, 3, 4]
    assert cli.main([a for a in argv if a != "--open"]) == 1  # without --open every step is checked now
    assert [s["ok"] for s in json.loads(capsys.readouterr().out)["steps"]] == [False, False, True, False]
    assert read_progress(state) == {"1": [1, 3, 4]}  # and what was done stays done


def test_the_list_gives_each_step_s_check_and_hint_from_the_guide(capsys, tmp_path):
    assert cli.main(["lesson", "--json", "--state-dir", str(tmp_path), "--tmp-dir", "/learner/tmp"]) == 0
    first = json.loads(capsys.readouterr().out)["lessons"][0]
    assert first["checks"][2] == "/learner/tmp/none.om exists containing 'run_id=\"none-7\"'"
    assert first["hints"][0].startswith("start a healthy run") and len(first["hints"]) == len(first["steps"])
    assert cli.main(["lesson", "list", "--open", "--state-dir", str(tmp_path)]) == 2
    assert "lesson list takes no --open" in capsys.readouterr().err


def test_the_console_runs_one_poll_at_a_time_and_answers_another_busy():
    from types import SimpleNamespace

    from runwatch.console import lessons as page

    console = SimpleNamespace()
    lock = page._polling.setdefault(id(console), __import__("threading").Lock())
    with lock:  # a poll is running: another (a second tab) is not started beside it
        assert page._poll_once(console, "1") == (None, "busy")
    del page._polling[id(console)]


@pytest.mark.integration
def test_every_promql_check_of_the_guide_runs_on_a_real_prometheus(tmp_path):
    """Each check's expression parses and evaluates (to nothing, on an empty Prometheus): a
    typo in the guide is caught here, not by a learner whose step never turns OK."""
    from runwatch.lesson import check_promql
    from runwatch.prom.server import Process, free_port, prometheus_argv
    from tests.conftest import need

    (tmp_path / "prometheus.yml").write_text("scrape_configs: []\n")
    port = free_port()
    argv = prometheus_argv(need("prometheus"), tmp_path / "prometheus.yml", tmp_path / "data", port)
    state = tmp_path / "state"
    state.mkdir()
    (state / "lab.json").write_text(json.dumps({"run_id": "r", "urls": {"prometheus": f"http://127.0.0.1:{port}"}}))
    lab = Lab(state, "r", tmp_path)
    exprs = [lab.expand(s.target) for lesson in read_lessons(GUIDE) for s in lesson.steps if s.kind == "promql"]
    with Process(argv, f"http://127.0.0.1:{port}/-/ready", tmp_path / "prometheus.log"):
        found = {expr: check_promql(expr, lab) for expr in exprs}
        broken = check_promql("up{", lab)
    assert len(exprs) >= 8
    assert {e: f for e, f in found.items() if f != (False, "no series yet")} == {}
    assert broken[0] is False and broken[1].startswith("Prometheus refused the query"), broken


def console_bound_ms() -> float:
    """How long a console page may take to answer an action: its longest wait for a command it
    runs (a diagnosis, a postmortem with its plate), or for a Check's check and list, one after
    the other. On a loaded machine these take far longer than Playwright's 30 s default."""
    from runwatch.console.app import COMMAND_TIMEOUT_S
    from runwatch.console.lessons import CHECK_TIMEOUT_S

    return max(COMMAND_TIMEOUT_S, 2 * CHECK_TIMEOUT_S) * 1000


def lesson(number: int, lab, *flags: str) -> tuple[int, list[str]]:
    """`runwatch lesson check N` on the lab: its exit status and the OK/NO of each step."""
    from tests.conftest import runwatch

    res = runwatch("lesson", "check", str(number), "--state-dir", str(lab.state), *flags, cwd=lab.cwd)
    marks = [line.split()[0] for line in res.stdout.splitlines() if line.startswith(("  OK", "  NO"))]
    assert res.returncode in (0, 1) and marks, res.stdout + res.stderr
    return res.returncode, marks


@pytest.mark.e2e
@pytest.mark.slow  # a lab of its own for about a minute, as the lab's other own-lab scenarios
def test_each_step_turns_ok_only_after_the_action_it_asks_for(lab_factory, tmp_path):
    from tests.conftest import runwatch, wait_for
    from tests.test_lab_e2e import NEAR_ONSET, firing_in_prometheus, group_interval_s, pages

    lab = lab_factory(*NEAR_ONSET).wait()
    assert lesson(2, lab) == (1, ["NO", "NO", "NO", "NO"])  # before the onset: nothing has paged
    # NEAR_ONSET leaves 25 lab seconds to the onset; the loss alert has no `for:`, pages at once
    onset_s = 300 - int(NEAR_ONSET[NEAR_ONSET.index("--fast-forward") + 1])
    wait_for(lambda: pages(lab, lab.run_id, "TrainingLossJump"), 2 * onset_s + group_interval_s(lab), "the page")
    grad = "GradientNormJump"  # fires with the loss's alert at a corrupt shard
    wait_for(
        lambda: firing_in_prometheus(lab, grad, lab.run_id) or pages(lab, lab.run_id, grad), group_interval_s(lab), grad
    )
    assert lesson(2, lab)[1][:2] == ["OK", "NO"]  # paged, not yet acknowledged
    res = runwatch("ack", "TrainingLossJump", "--comment", "loss 20x, grad norm 5x", "--state-dir", str(lab.state),
                   cwd=lab.cwd)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert lesson(2, lab)[1][:2] == ["OK", "OK"]

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    assert lesson(1, lab, "--tmp-dir", str(tmp))[1] == ["OK", "OK", "NO", "NO"]
    offline = ("--offline", "--out", str(tmp / "none.om"), "--incident", "none", "--seed", "7")
    res = runwatch("train", *offline, cwd=lab.cwd)
    assert res.returncode == 0, res.stderr
    assert lesson(1, lab, "--tmp-dir", str(tmp))[1] == ["OK", "OK", "OK", "NO"]

    assert runwatch("down", "--state-dir", str(lab.state), cwd=lab.cwd).returncode == 0
    assert lesson(2, lab)[1][:2] == ["NO", "NO"]  # the lab is down: its Prometheus and pager are gone
    listed = runwatch("lesson", "--state-dir", str(lab.state), cwd=lab.cwd).stdout
    assert "lesson 1 of 7  3/4 steps" in listed and "lesson 2 of 7  2/4 steps" in listed, listed
    assert "next: lesson 1, step 4: you trained the slow-node run offline" in listed, listed


@pytest.mark.e2e
@pytest.mark.slow  # a lab of its own for about a minute, in Chromium
def test_a_learner_does_lesson_2_s_live_steps_through_the_console_alone(lab_factory, tab):
    """The console's Lessons page runs the same checks: NO before the page, OK for the page and NO
    for the ack until the learner presses Ack on the incident, OK after; the table counts them."""
    from tests.conftest import wait_for
    from tests.test_lab_e2e import NEAR_ONSET, firing_in_prometheus, group_interval_s

    lab = lab_factory(*NEAR_ONSET).wait()
    console = lab.url("console")
    tab.set_default_timeout(console_bound_ms())

    def checked() -> list[str]:
        tab.goto(f"{console}/lessons")
        tab.click('tr[data-lesson="2"] button.check')
        tab.wait_for_selector('#lesson[data-lesson="2"]')
        return [tab.inner_text(f'#lesson li[data-step="{i}"] .verdict') for i in (1, 2)]

    assert checked() == ["NO", "NO"]
    # lesson 1 is next; the page's poll of it, on the first view, may have completed its step 1, or
    # steps 1 and 2 (the lab is up, and its run's four signals scraped), before the Check was pressed
    assert tab.inner_text("#next") in ("lesson 1 of 7, step 1", "lesson 1 of 7, step 2", "lesson 1 of 7, step 3")
    assert "ALERTS{" in tab.inner_text('#lesson li[data-step="1"]')  # the check is shown, as the learner can run it
    onset_s = 300 - int(NEAR_ONSET[NEAR_ONSET.index("--fast-forward") + 1])
    for alert in ("TrainingLossJump", "GradientNormJump"):
        wait_for(lambda a=alert: firing_in_prometheus(lab, a, lab.run_id), 2 * onset_s + group_interval_s(lab), alert)
    assert checked() == ["OK", "NO"]
    tab.goto(f"{console}/?run={lab.run_id}")
    tab.wait_for_selector('li.incident[data-alert="TrainingLossJump"] button.ack').click()
    tab.fill("#ack-comment", "loss 20x and gradient norm 5x at once: bad data?")
    tab.click("#ack-submit")
    assert "acknowledged TrainingLossJump" in tab.wait_for_selector("#notice").inner_text()
    assert checked() == ["OK", "OK"]
    assert tab.inner_text('tr[data-lesson="2"] .done') == "2 of 4"


@pytest.mark.integration
def test_the_console_s_lessons_page_checks_with_its_token_against_a_real_pager(tmp_path):
    """`runwatch console` over HTTP, with a real pager holding a corrupt shard's page and no
    Prometheus: the page lists the lessons; Check is refused without the console's token; with it,
    lesson 2's ack step is NO until the pager records an ack, then OK, and the page says so."""
    import re
    import subprocess
    import sys
    import threading
    import time

    import requests
    from prometheus_client import CollectorRegistry

    from runwatch.console.lessons import LIST_KEPT_S
    from runwatch.oncall.pager_serve import DEFAULT_RUNBOOKS
    from runwatch.oncall.server import make_server
    from runwatch.prom.server import free_port, wait_ready

    page = {"received_at": "2026-01-01T00:00:01.000Z", "alert": "TrainingLossJump", "status": "firing",
            "run_id": "corrupt_shard-0-120000", "step": "300", "summary": "s", "description": "d",
            "severity": "page"}  # fmt: skip
    (tmp_path / "pages.jsonl").write_text(json.dumps(page) + "\n")
    pager = make_server(
        "127.0.0.1", 0, tmp_path / "pages.jsonl", registry=CollectorRegistry(), runbooks=DEFAULT_RUNBOOKS
    )
    threading.Thread(target=pager.serve_forever, daemon=True).start()
    pager_url, nowhere, port = (
        f"http://127.0.0.1:{pager.server_address[1]}",
        f"http://127.0.0.1:{free_port()}",
        free_port(),
    )
    (tmp_path / "state").mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "runwatch", "console", "--port", str(port), "--prometheus", nowhere, "--alertmanager",
         nowhere, "--pager", pager_url, "--state-dir", str(tmp_path / "state")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        assert wait_ready(f"{base}/-/ready", 30, proc), proc.stderr.read()
        listed = requests.get(f"{base}/lessons", timeout=60).text
        assert listed.count('<tr data-lesson="') == 7 and "lesson 1 of 7, step 1" in listed, listed
        # a GET lists the lessons through a child process at most every LIST_KEPT_S: progress
        # written meanwhile shows only after that, or after a Check
        listed_at = time.monotonic()
        (tmp_path / "state" / "lessons.json").write_text('{"done": {"1": [1]}}')
        again = requests.get(f"{base}/lessons", timeout=60).text
        if time.monotonic() - listed_at < LIST_KEPT_S:
            assert "lesson 1 of 7, step 1" in again
        token = re.search(r'name="token" value="([^"]+)"', listed)[1]
        assert requests.post(f"{base}/lessons/check", data={"lesson": "2"}, timeout=60).status_code == 403

        def step2() -> str:
            text = requests.post(f"{base}/lessons/check", data={"lesson": "2", "token": token}, timeout=60).text
            return re.search(r'data-step="2">\s*<b class="verdict">(OK|NO)</b>', text)[1]

        assert step2() == "NO"
        assert "lesson 1 of 7, step 2" in requests.post(f"{base}/lessons/check", data={"lesson": "2", "token": token},
                                                        timeout=60).text  # fmt: skip
        ack = {
            "alert": "TrainingLossJump",
            "run_id": page["run_id"],
            "comment": "bad data?",
            "by": "ada",
            "ack_id": "1",
        }
        # what the page's script polls: the open steps, as JSON, with the same token
        assert requests.post(f"{base}/lessons/poll", data={"lesson": "2"}, timeout=60).status_code == 403
        polled = requests.post(f"{base}/lessons/poll", data={"lesson": "2", "token": token}, timeout=60).json()
        assert [s["ok"] for s in polled["steps"]] == [False, False, False, False], polled
        assert polled["next"] == {"lesson": 1, "step": 2, "text": polled["next"]["text"]}  # lesson 1's step 1: done
        assert requests.post(f"{pager_url}/api/ack", json=ack, timeout=10).status_code == 200
        polled = requests.post(f"{base}/lessons/poll", data={"lesson": "2", "token": token}, timeout=60).json()
        assert polled["steps"][1]["ok"] and polled["done_ever"] == [2], polled
        assert step2() == "OK"
        assert json.loads((tmp_path / "state" / "lessons.json").read_text())["done"]["2"] == [2]
    finally:
        proc.terminate()
        proc.wait(10)
        pager.shutdown()


def polled(page, steps: int) -> list[str]:
    """The Lessons page's verdicts once its next poll has answered (static/lessons.js counts them)."""
    n = int(page.get_attribute("#lesson", "data-polled"))
    page.wait_for_selector(f'#lesson:not([data-polled="{n}"])')  # it only counts up; no eval: the CSP forbids it
    return [page.inner_text(f'#lesson li[data-step="{i}"] .verdict') for i in range(1, steps + 1)]


def turns_ok(page, step: int) -> None:
    """Wait, with no click, for the page's poll to mark the step OK."""
    page.wait_for_selector(f'#lesson li[data-step="{step}"].ok')


@pytest.mark.e2e
@pytest.mark.slow  # a lab of its own and a console started before it, in Chromium: about a minute
def test_a_learner_completes_lesson_1_and_its_steps_complete_themselves(tmp_path, tab):
    """Lesson 1 on the Lessons page of a console started before the lab (on the ports the lab
    will take), its $TMP the test's own: each step reads NO while the page polls, until the
    learner does what it asks (starts the lab; trains the two runs offline with the guide's
    commands), then turns OK without a click on Check; the header moves from lesson 1, step 1 to
    lesson 2, step 1, and the progress is kept."""
    import subprocess
    import sys

    from runwatch.core.addresses import DEFAULT_PORTS
    from runwatch.prom.server import free_port, wait_ready
    from tests.conftest import LabStart, runwatch

    # the three the console reads are chosen now; the rest are the lab's to choose (0)
    ports = {
        **dict.fromkeys(DEFAULT_PORTS, 0),
        **{name: free_port() for name in ("prometheus", "alertmanager", "pager")},
    }
    root, state, tmp = tmp_path / "lab", tmp_path / "lab" / "state", tmp_path / "tmp"
    for d in (state, tmp):
        d.mkdir(parents=True)
    console = f"http://127.0.0.1:{free_port()}"
    argv = [sys.executable, "-m", "runwatch", "console", "--port", console.rsplit(":", 1)[1], "--state-dir",
            str(state), "--tmp-dir", str(tmp), "--prometheus", f"http://127.0.0.1:{ports['prometheus']}",
            "--alertmanager", f"http://127.0.0.1:{ports['alertmanager']}",
            "--pager", f"http://127.0.0.1:{ports['pager']}"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lab = None
    tab.set_default_timeout(console_bound_ms())
    try:
        assert wait_ready(f"{console}/-/ready", 30, proc), proc.stderr.read()
        tab.goto(f"{console}/lessons")
        assert tab.inner_text("#next") == "lesson 1 of 7, step 1"
        assert "none.om exists" in tab.inner_text('#lesson li[data-step="3"]')  # the check, as the learner reads it
        assert polled(tab, 4) == ["NO", "NO", "NO", "NO"]  # no lab yet
        assert "is the lab up?" in tab.inner_text('#lesson li[data-step="1"] .found')
        lab = LabStart(root, "--ports", ",".join(f"{n}={p}" for n, p in ports.items()))
        lab.wait()
        turns_ok(tab, 1)
        turns_ok(tab, 2)
        assert polled(tab, 4)[2:] == ["NO", "NO"] and tab.inner_text("#next") == "lesson 1 of 7, step 3"
        offline = ("train", "--offline", "--incident", "none", "--seed", "7", "--out", str(tmp / "none.om"))
        assert runwatch(*offline, cwd=tmp).returncode == 0
        turns_ok(tab, 3)
        assert polled(tab, 4)[3] == "NO"
        slow = ("train", "--offline", "--incident", "slow_node", "--seed", "7", "--out", str(tmp / "slow.om"))
        assert runwatch(*slow, cwd=tmp).returncode == 0
        turns_ok(tab, 4)
        tab.wait_for_selector("#lesson-done:not([hidden])")
        assert tab.inner_text("#next") == "lesson 2 of 7, step 1"
        assert tab.inner_text('tr[data-lesson="1"] .done') == "4 of 4"
        assert read_progress(state)["1"] == [1, 2, 3, 4]
    finally:
        proc.terminate()
        proc.wait(10)
        if lab is not None:
            lab.stop()


@pytest.mark.e2e
@pytest.mark.slow  # a drill of its own for about a minute, in Chromium
def test_a_learner_does_the_on_call_lesson_in_the_console_each_step_after_its_action(lab_state, tmp_path, tab):
    """Practise on-call (lesson 6) on the drill of seed 516 (a corrupt shard from step 247): the
    Lessons page open in one tab polls the lesson's open steps; every step after the drill's
    start reads NO until the learner does it in the console's other tab (the page comes, Ack,
    Diagnose, Write the postmortem), then turns OK by itself, with no click on Check."""
    from runwatch.core.addresses import lab_url
    from tests.test_drill_e2e import drill
    from tests.test_oncall_e2e import PAGE_WITHIN_S

    drill(tmp_path, lab_state, 516)
    console = lab_url(lab_state, "console")
    tab.set_default_timeout(console_bound_ms())
    work = tab.context.new_page()  # where the learner works; `tab` keeps the Lessons page open
    work.set_default_timeout(console_bound_ms())
    tab.goto(f"{console}/lessons?lesson=6")
    assert polled(tab, 5)[1:] == ["NO", "NO", "NO", "NO"]  # the drill's first scrape may still be coming
    turns_ok(tab, 1)
    work.goto(f"{console}/")
    incident = 'li.incident[data-alert="TrainingLossJump"] button.ack'
    work.wait_for_selector(incident, timeout=PAGE_WITHIN_S * 1000)  # the page, as the learner sees it come
    turns_ok(tab, 2)
    assert polled(tab, 5)[2:] == ["NO", "NO", "NO"]
    work.wait_for_selector(incident).click()
    work.fill("#ack-comment", "loss 20x and gradient norm 5x at once: bad data?")
    work.click("#ack-submit")
    work.wait_for_selector("#notice")
    turns_ok(tab, 3)
    assert polled(tab, 5)[3:] == ["NO", "NO"]
    work.goto(f"{console}/")
    work.select_option("#diagnose-incident", "corrupt_shard")
    work.click("#diagnose-submit")
    assert work.wait_for_selector("#notice").inner_text().startswith("CORRECT")
    turns_ok(tab, 4)
    assert polled(tab, 5)[4] == "NO"
    work.goto(f"{console}/")
    work.click("#postmortem-submit")
    work.wait_for_selector("article.postmortem h2")
    turns_ok(tab, 5)
    tab.wait_for_selector("#lesson-done:not([hidden])")
    assert "lesson 1 of 7, step 1" in tab.inner_text("#next")  # lesson 6 done; lesson 1 not begun
    assert tab.inner_text('tr[data-lesson="6"] .done') == "5 of 5"


@pytest.mark.integration
def test_a_promtool_step_is_promtool_s_own_verdict_on_the_learner_s_copy(tmp_path):
    """Lesson 4's `promtool:` step runs the real promtool on $TMP/myrules: NO before the copy,
    OK for the copy, NO with promtool's message naming the file once an edit breaks it."""
    import shutil

    from tests.conftest import edit

    (step,) = [s for s in read_lessons(GUIDE)[3].steps if s.kind == "promtool"]
    lab = Lab(tmp_path / "state", "", tmp_path)
    assert check(step, lab) == (False, f"no rule files (*.yml) in {tmp_path / 'myrules'}")
    shutil.copytree(REPO / "prometheus" / "rules", tmp_path / "myrules")
    ok, found = check(step, lab)
    assert ok and found.startswith("promtool: SUCCESS"), found
    edit(tmp_path / "myrules" / "alerts.yml", "expr: vector(2)", "expr: vector(2", count=1)
    ok, found = check(step, lab)
    assert not ok and found.startswith("promtool: ") and "alerts.yml" in found, found
