"""Every link the console offers leads somewhere (issue 36, item 4), crawled in a real browser
(Debian's chromium, driven by Playwright) on the worker's shared lab: from the run's page, each
page of the console is opened as a learner opens it (its scripts run, its pages and incidents
drawn), each of its links followed, and every link to another server (the pager's runbooks,
Prometheus, Grafana) asked for. None may answer 404 or fail; the native lab's Prometheus (Debian's
build) serves no web pages, so the console offers no link into them.
"""

from __future__ import annotations

from urllib.parse import urljoin, urlsplit

import requests

from tests.test_console_e2e import REFRESH_S

MAX_PAGES = 200  # the console's pages of one lab: its runs, rules, runbooks and postmortems, a few dozen


def links(tab) -> list[str]:
    return tab.evaluate("[...document.querySelectorAll('a[href]')].map(a => a.href)")


def test_every_console_link_answers_and_the_run_picker_lists_each_run_once(lab, tab):
    console = lab.url("console")
    own = urlsplit(console).netloc
    queue, seen, outside, broken = [f"{console}/"], set(), set(), []
    while queue and len(seen) < MAX_PAGES:
        url = queue.pop(0).split("#")[0]
        if url in seen:
            continue
        seen.add(url)
        resp = tab.goto(url)
        if resp is None or resp.status >= 400:
            broken.append((url, resp and resp.status))
            continue
        if urlsplit(url).path == "/":  # the run's page: console.js draws the incidents (and their links) it polls
            tab.wait_for_timeout(2 * REFRESH_S * 1000)
        for href in links(tab):
            target = urljoin(url, href)
            if urlsplit(target).scheme not in ("http", "https"):
                continue
            if urlsplit(target).netloc == own:
                queue.append(target)
            else:
                outside.add(target)
    assert not queue, f"more than {MAX_PAGES} pages: the crawl did not end"
    for target in sorted(outside):
        try:
            status = requests.get(target, timeout=10).status_code
        except requests.RequestException as err:
            status = type(err).__name__
        if status != 200:
            broken.append((target, status))
    assert broken == [], broken
    assert any("/runbook/" in u for u in seen) and any("/rules/" in u for u in seen), sorted(seen)

    tab.goto(f"{console}/")
    runs = tab.eval_on_selector_all("#run-picker option", "options => options.map(o => o.value)")
    assert lab.run_id in runs and len(runs) == len(set(runs)), runs
