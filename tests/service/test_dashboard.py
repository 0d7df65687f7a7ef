"""The dashboard in a real headless browser (Debian's ``chromium`` and
``chromium-driver``, driven by Selenium) against a real ``pollux-opt serve``
with real jobs: the table fills and follows the jobs live, the cluster draws,
cancelling from the page cancels the job, and a token set on the server is
asked for and sent."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

pytest.importorskip("fastapi", reason="the service needs its extra (pip install 'pollux-opt[service]')")
pytest.importorskip("torch", reason="real jobs need the CPU build of torch (pip install 'pollux-opt[jobs]')")
pytest.importorskip("sklearn", reason="the digits job needs scikit-learn (pip install 'pollux-opt[jobs]')")
httpx = pytest.importorskip("httpx")
webdriver = pytest.importorskip("selenium.webdriver", reason="browser tests need selenium (pip install -e '.[dev]')")

from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups and /proc")

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
#: A job that reaches its target in seconds of training ...
QUICK = {"kind": "synth-regress", "replicas": 1, "batch_size": 32, "name": "quick",
         "spec": {"target": 0.3, "eval_every": 20, "config": {"samples": 20_000, "width": 64}}}
#: ... and one that would train for many minutes: the one to cancel from the page.
LONG = {"kind": "digits-cnn", "replicas": 1, "batch_size": 32, "name": "long",
        "spec": {"target": 0.999, "eval_every": 50}}
#: The charts the page shows (every one must draw).
CHARTS_SHOWN = {"allocations", "goodput", "utilisation", "jobs", "decisions", "batch"}
#: The charts of one job's panel.
JOB_CHARTS_SHOWN = {"allocations", "goodput", "batch", "step_time", "efficiency"}
#: Seconds the page may take to show what the server did (jobs start and end within a minute on 2 CPUs).
WAIT_S = 120.0
#: Records, in the page, when each job's row first showed each state (seconds, Unix time).
WATCH_ROWS = """
window.seen = {};
new MutationObserver(() => {
  for (const tr of document.querySelectorAll('#jobs tbody tr')) {
    const key = tr.dataset.id + ':' + tr.dataset.state;
    if (!(key in window.seen)) window.seen[key] = Date.now() / 1000;
  }
}).observe(document.querySelector('#jobs tbody'), {childList: true, subtree: true, attributes: true});
window.notReloaded = true;
"""


@pytest.fixture
def browser():
    if not (CHROMIUM and DRIVER):
        missing = "no headless browser here: install Debian's chromium and chromium-driver (.ci/run does)"
        if os.environ.get("POLLUX_OPT_REQUIRE_BROWSER"):
            pytest.fail(missing)
        pytest.skip(missing)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,800"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=DRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def rows(browser) -> dict[str, str]:
    """The jobs table: job id -> the state its row shows (read at once: an event redraws the rows)."""
    return browser.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('#jobs tbody tr')]"
        ".map(tr => [tr.dataset.id, tr.dataset.state]))")


def holders(browser) -> list[str]:
    """The job holding each CPU the cluster view draws ('' where free)."""
    return browser.execute_script("return [...document.querySelectorAll('#cluster rect')].map(r => r.dataset.job)")


def charts_drawn(browser) -> set[str]:
    """The charts on the page that draw at least one series."""
    return set(browser.execute_script(
        "return [...document.querySelectorAll('figure[data-chart]')]"
        ".filter(f => f.dataset.job === undefined && f.querySelector('.series')).map(f => f.dataset.chart)"))


def job_charts_drawn(browser) -> set[str]:
    """The charts of the job panel that draw at least one series."""
    return set(browser.execute_script(
        "return [...document.querySelectorAll('#job-panel figure[data-chart]')]"
        ".filter(f => f.querySelector('.series')).map(f => f.dataset.chart)"))


def click_action(browser, job_id: str, label: str) -> None:
    """Click the ``label`` button of ``job_id``'s row (again if an event redrew the row meanwhile)."""
    for _ in range(10):
        try:
            row = browser.find_element(By.CSS_SELECTOR, f"#jobs tbody tr[data-id='{job_id}']")
            next(b for b in row.find_elements(By.TAG_NAME, "button") if b.text == label).click()
            return
        except StaleElementReferenceException:
            continue
    raise AssertionError(f"no stable {label!r} button on job {job_id}'s row")


def wait_for(browser, condition, message: str):
    return WebDriverWait(browser, WAIT_S, poll_frequency=0.1).until(lambda _: condition(), message)


def test_the_page_follows_jobs_live_draws_the_cluster_and_cancels_from_a_row(tmp_path, serve_process, browser,
                                                                            record_property):
    server = serve_process(tmp_path / "state").start()
    quick, long = server.submit(QUICK), server.submit(LONG)
    browser.get(f"{server.url}/")
    record_property("first_load_ms", browser.execute_script(
        "return performance.getEntriesByType('navigation')[0].duration"))
    browser.execute_script(WATCH_ROWS)
    wait_for(browser, lambda: set(rows(browser)) == {quick, long}, "the table lists both jobs")
    wait_for(browser, lambda: rows(browser)[quick] == "succeeded", "the quick job's end reaches the page")
    ended = next(m["t"] for m in server.job(quick)["transitions"] if m["new"] == "succeeded")
    shown = browser.execute_script(f"return window.seen['{quick}:succeeded']")
    record_property("event_to_page_s", shown - ended)
    wait_for(browser, lambda: rows(browser)[long] == "running", "the long job trains")
    wait_for(browser, lambda: long in holders(browser), "the cluster view shows the long job's CPU")
    assert len(holders(browser)) == 2  # every CPU of the cluster, held or free
    assert "allocated" in browser.find_element(By.ID, "cluster-summary").text
    wait_for(browser, lambda: charts_drawn(browser) == CHARTS_SHOWN, "every chart draws a series")
    click_action(browser, long, long)  # its id opens the job's panel
    wait_for(browser, lambda: browser.find_element(By.ID, "job-log").text.strip(), "the job's log shows")
    wait_for(browser, lambda: job_charts_drawn(browser) == JOB_CHARTS_SHOWN, "the job's charts draw")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#job-transitions tbody tr")) >= 3  # queued, rescaling, ...
    click_action(browser, long, "cancel")
    browser.switch_to.alert.accept()
    wait_for(browser, lambda: server.job(long)["state"] == "cancelled", "the job is cancelled in the API")
    wait_for(browser, lambda: rows(browser)[long] == "cancelled", "and on the page")
    assert browser.execute_script("return window.notReloaded") is True  # all of it without a reload
    assert browser.find_element(By.ID, "status").get_attribute("data-state") == "live"
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], errors


def test_with_a_token_set_the_page_asks_for_it_and_shows_nothing_without_it(tmp_path, serve_process, browser):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-dashboard-token\n")
    server = serve_process(tmp_path / "state", args=("--cpus", "2", "--token-file", str(token_file))).start()
    answer = httpx.post(f"{server.url}/api/v1/jobs", json=QUICK, timeout=30.0,
                        headers={"Authorization": "Bearer s3cret-dashboard-token"})
    assert answer.status_code == 201, answer.text
    browser.get(f"{server.url}/")
    status = browser.find_element(By.ID, "status")
    wait_for(browser, lambda: "needs a token" in status.text, "the page says the server needs a token")
    assert rows(browser) == {} and browser.find_element(By.ID, "token-form").is_displayed()
    box = browser.find_element(By.ID, "token")
    box.send_keys("wrong")
    box.submit()
    wait_for(browser, lambda: "wrong token" in status.text, "a wrong token is refused")
    assert rows(browser) == {}
    box.clear()
    box.send_keys("s3cret-dashboard-token")
    box.submit()
    wait_for(browser, lambda: set(rows(browser)) == {answer.json()["id"]}, "with the token the jobs show")
    wait_for(browser, lambda: status.get_attribute("data-state") == "live", "and the page follows the events")


def test_the_page_says_when_the_server_is_gone_and_follows_it_again_after_a_restart(tmp_path, serve_process,
                                                                                     browser):
    import signal

    first = serve_process(tmp_path / "state").start()
    before = first.submit(QUICK)
    browser.get(f"{first.url}/")
    browser.execute_script(WATCH_ROWS)
    status = browser.find_element(By.ID, "status")
    wait_for(browser, lambda: rows(browser).get(before) == "succeeded", "the first server's job")
    assert first.kill(signal.SIGTERM) in (0, 128 + signal.SIGTERM, -signal.SIGTERM)
    wait_for(browser, lambda: status.get_attribute("data-state") != "live", "the page sees the server gone")
    second = serve_process(tmp_path / "state", port=first.port).start()
    wait_for(browser, lambda: status.get_attribute("data-state") == "live", "the page follows the new server")
    after = second.submit(QUICK)
    wait_for(browser, lambda: rows(browser).get(after) == "succeeded", "a job of the restarted server")
    assert rows(browser)[before] == "succeeded" and browser.execute_script("return window.notReloaded") is True
