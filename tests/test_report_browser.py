"""The reports in a real headless browser (Debian's Chromium through Selenium): they render
without script errors, the filters and the task-id search show the right rows, and model text
with HTML or <script> in it is shown as text and never run.

Needs ``apt-get install chromium chromium-driver`` and the ``selenium`` package; skipped (with the
reason) when either is missing, unless ``SEAL_REQUIRE_BROWSER=1`` (then missing ones fail). Chromium
starts with a fresh profile and no network services; Selenium uses the system chromedriver, so it
downloads nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from seal_rl.report import write_compare_report, write_report
from tests.report_runs import episode, write_eval_run, write_training_run

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
try:
    from selenium import webdriver
except ImportError:
    webdriver = None
MISSING = [why for missing, why in ((CHROMIUM is None or DRIVER is None, "headless Chromium is not installed (apt-get install "
                                     "chromium chromium-driver)"), (webdriver is None, "selenium is not installed (pip install "
                                     "selenium)")) if missing]  # fmt: skip
if MISSING and os.environ.get("SEAL_REQUIRE_BROWSER") == "1":  # CI that must run these says so
    pytest.fail("SEAL_REQUIRE_BROWSER=1 but " + "; ".join(MISSING), pytrace=False)
pytestmark = pytest.mark.skipif(bool(MISSING), reason="; ".join(MISSING))

HOSTILE = ('<script>window.__pwned=1;document.title="pwned"</script><img src=x onerror="window.__pwned=2;'
           'document.title=\'pwned\'"><b id="injected">bold</b>')  # fmt: skip


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    with tempfile.TemporaryDirectory() as profile:
        for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                     "--disable-sync", "--no-first-run", f"--user-data-dir={profile}", "--window-size=1280,1000"):  # fmt: skip
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        driver = webdriver.Chrome(options=options, service=Service(DRIVER))  # the system driver: nothing downloaded
        try:
            yield driver
        finally:
            driver.quit()


def _open(browser, path):
    browser.get(path.as_uri())
    browser.get_log("browser")  # drop what an earlier page logged
    browser.refresh()
    return browser


def _errors(browser):
    return [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]


def _visible(browser, selector="details.episode"):
    return browser.execute_script(f"return [...document.querySelectorAll({json.dumps(selector)})]"
                                  ".filter(e => e.offsetParent !== null).map(e => e.dataset.task)")  # fmt: skip


def _type(browser, element_id, text):
    from selenium.webdriver.common.keys import Keys

    box = browser.find_element("id", element_id)
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.BACKSPACE)  # typed, so the page sees input events (clear() sends none)
    box.send_keys(text)


def _choose(browser, element_id, value):
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element("id", element_id)).select_by_value(value)


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory):
    """Hand-written results: 9 episodes over three categories, hostile model text in one."""
    records = []
    for i in range(9):
        category = ("base", "miss_func", "miss_param")[i % 3]
        records.append(episode(f"multi_turn_{category}_{i}", category, index=i + 1, reward=float(i % 2),
                               labels=("pass", "state_mismatch") if i % 2 == 0 else ("pass",),
                               text=HOSTILE if i == 4 else "done"))  # fmt: skip
    return write_eval_run(tmp_path_factory.mktemp("eval") / "run", records)


def test_the_eval_report_renders_and_runs_no_model_text(browser, eval_run):
    page = _open(browser, write_report(eval_run))
    assert page.title == f"seal-rl evaluation: {eval_run.name}" and not _errors(page)
    assert page.execute_script("return window.__pwned === undefined && document.getElementById('injected') === null")
    for element in page.find_elements("css selector", "details.episode"):
        page.execute_script("arguments[0].open = true", element)  # the hostile text now on screen
    assert page.execute_script("return window.__pwned === undefined") and page.title == f"seal-rl evaluation: {eval_run.name}"
    assert HOSTILE in page.find_element("css selector", 'details.episode[data-task="multi_turn_miss_func_4"]').text
    assert len(page.find_elements("css selector", "img")) == 3 and not _errors(page)


def test_the_eval_filters_and_search_show_the_right_rows(browser, eval_run):
    page = _open(browser, write_report(eval_run))
    assert len(_visible(page)) == 9 and page.find_element("id", "f-count").text == "9 episodes shown"
    _type(page, "f-task", "base")
    assert sorted(_visible(page)) == ["multi_turn_base_0", "multi_turn_base_3", "multi_turn_base_6"]
    _type(page, "f-task", "MULTI_TURN_MISS_FUNC_7")  # case does not matter
    assert _visible(page) == ["multi_turn_miss_func_7"] and page.find_element("id", "f-count").text == "1 episodes shown"
    _type(page, "f-task", "")
    _choose(page, "f-label", "state_mismatch")
    assert sorted(_visible(page)) == sorted(f"multi_turn_{('base', 'miss_func', 'miss_param')[i % 3]}_{i}" for i in (0, 2, 4, 6, 8))
    _choose(page, "f-cat", "miss_param")
    assert _visible(page) == ["multi_turn_miss_param_2", "multi_turn_miss_param_8"]
    _choose(page, "f-label", "")
    _choose(page, "f-out", "pass")
    assert _visible(page) == ["multi_turn_miss_param_5"] and not _errors(page)


def test_the_training_report_renders_and_its_rollouts_are_searchable(browser, tmp_path):
    run = write_training_run(tmp_path / "run", rounds=3, per_round=4, text=HOSTILE)
    page = _open(browser, write_report(run))
    assert page.title == "seal-rl training: run" and not _errors(page)
    for element in page.find_elements("css selector", "details"):
        page.execute_script("arguments[0].open = true", element)
    assert page.execute_script("return window.__pwned === undefined && document.getElementById('injected') === null")
    assert len(_visible(page)) == 12
    _type(page, "f-task", "miss_param")
    assert _visible(page) == ["multi_turn_miss_param_105"] * 6
    _choose(page, "f-out", "pass")
    assert _visible(page) == [] and page.find_element("id", "f-count").text == "0 episodes shown"
    _type(page, "f-task", "")
    assert _visible(page) == ["multi_turn_base_105"] * 6 and not _errors(page)


def test_the_comparison_page_searches_its_flips(browser, tmp_path):
    a = write_eval_run(tmp_path / "a", [episode(f"multi_turn_base_{i}", "base", index=i, reward=0.0) for i in range(6)])
    b = write_eval_run(tmp_path / "b", [episode(f"multi_turn_base_{i}", "base", index=i, reward=float(i < 4)) for i in range(6)])
    page = _open(browser, write_compare_report(a, b, tmp_path / "cmp.html", resamples=100))
    assert not _errors(page) and len(_visible(page, "tr.flip")) == 4
    _type(page, "f-task", "base_2")
    assert _visible(page, "tr.flip") == ["multi_turn_base_2"] and page.find_element("id", "f-count").text == "1 flipped episodes shown"


def test_chromium_version_is_reported():
    """Which Chromium ran these tests (the CI log shows it)."""
    result = subprocess.run([CHROMIUM, "--version"], capture_output=True, text=True, timeout=60)
    assert "Chromium" in result.stdout, result.stderr
    print(result.stdout.strip(), file=sys.stderr)
