"""Screenshot the on-call console in each state, from real runs: docs/console/*.png.

    python docs/console/make_screenshots.py      # about 3 minutes; uses the native lab's ports

1. A native lab with a corrupt shard (fast-forwarded to step 270): the plate and the pages
   (plate-and-pages.png), a page's runbook (page-and-runbook.png), an ack (acked.png).
2. A drill whose hidden incident is a corrupt shard from step 247 (seed 516 under the tests'
   drill key): the plate without its incident window (drill.png), then the ack and the graded
   diagnosis (diagnosed.png) and the postmortem with its plate (postmortem.png).

Chromium is Debian's, driven by Playwright, as in the tests.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

from runwatch.oncall.page_log import read_pages

HERE = Path(__file__).parent
CONSOLE = "http://127.0.0.1:9096"
DRILL_KEY, DRILL_SEED = "runwatch-tests", 516  # corrupt_shard from step 247 (tests/test_drill_e2e.py)


def runwatch(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "runwatch", *args], check=True, stdout=subprocess.DEVNULL)


def wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.5)
    raise SystemExit(f"make_screenshots: timed out waiting for {what}")


def paged(state: Path, alert: str) -> bool:
    run_id = json.loads((state / "lab.json").read_text())["run_id"]
    return any(p["alert"] == alert and p["run_id"] == run_id for p in read_pages(state / "pages.jsonl"))


def shot(page: Page, name: str) -> None:
    page.wait_for_timeout(1500)  # a refresh or two of the plate after the last action
    page.screenshot(path=str(HERE / name), full_page=True)
    print(f"wrote {HERE / name}")


def incident_lab(page: Page, state: Path) -> None:
    runwatch("up", "--state-dir", str(state), "--incident", "corrupt_shard", "--fast-forward", "270", "--detach")
    try:
        wait(lambda: paged(state, "TrainingLossJump"), 120, "the corrupt shard's page")
        page.goto(f"{CONSOLE}/")
        page.wait_for_selector('li.incident[data-alert="TrainingLossJump"] button.ack')
        shot(page, "plate-and-pages.png")
        page.click('li.incident[data-alert="GradientNormJump"] button.show-runbook')
        page.wait_for_selector('#runbook article[data-alert="GradientNormJump"]')
        shot(page, "page-and-runbook.png")
        page.click('li.incident[data-alert="TrainingLossJump"] button.ack')
        page.fill("#ack-comment", "loss 20x and gradient norm 5x at the same step: bad data?")
        page.click("#ack-submit")
        page.wait_for_selector("#notice")
        shot(page, "acked.png")
    finally:
        runwatch("down", "--state-dir", str(state))


def drill(page: Page, state: Path) -> None:
    state.mkdir(parents=True)
    (state / "drill.key").write_text(DRILL_KEY + "\n")
    runwatch("drill", "--state-dir", str(state), "--seed", str(DRILL_SEED), "--fast-forward", "220")
    try:
        wait(lambda: paged(state, "GradientNormJump"), 120, "the drill's page")
        page.goto(f"{CONSOLE}/")
        page.wait_for_selector('li.incident[data-alert="GradientNormJump"]')
        shot(page, "drill.png")
        # first ack (what you know so far), then diagnose
        page.click('li.incident[data-alert="GradientNormJump"] button.ack')
        page.fill("#ack-comment", "gradient norm 5x at once: looking at the loss")
        page.click("#ack-submit")
        page.wait_for_selector("#notice")
        page.select_option("#diagnose-incident", "corrupt_shard")
        page.fill("#diagnose-step", "247")
        page.click("#diagnose-submit")
        page.wait_for_selector("#notice")
        shot(page, "diagnosed.png")
        page.click("#postmortem-submit")  # writes it and shows it
        page.wait_for_selector("article.postmortem img")
        shot(page, "postmortem.png")
    finally:
        runwatch("down", "--state-dir", str(state))


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        page = browser.new_context(viewport={"width": 1500, "height": 1000}).new_page()
        page.set_default_timeout(120_000)  # writing the postmortem draws its plate: slow on a busy host
        incident_lab(page, Path(tmp) / "incident")
        drill(page, Path(tmp) / "drill")
        browser.close()


if __name__ == "__main__":
    main()
