#!/usr/bin/env python
"""Screenshots of the dashboard while the demo's workload runs on ``pollux-opt serve``.

A server on this machine's CPUs (``service_targets.Server``) gets the demo
workload's jobs (``mixed``, quick variant by default) at their arrival times;
headless Chromium (Debian's ``chromium`` and ``chromium-driver``, through
Selenium) photographs the page at 1280 x 800 once a third and once two thirds
of the jobs have ended, and at the end one job's panel and the page on a
narrow window::

    python experiments/dashboard_screenshots.py --out docs/img
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from service_targets import Server, _ended  # noqa: E402

from pollux_opt.workloads.load import load_workload  # noqa: E402

log = logging.getLogger("dashboard_screenshots")

#: Seconds the whole workload may take on 2 CPUs before the script gives up.
RUN_LIMIT_S = 1800.0
#: Window sizes of the screenshots, pixels: the wide one and a narrow (phone-like) one.
WIDE, NARROW = (1280, 800), (480, 900)
#: Seconds between looks at the jobs' states.
POLL_S = 2.0


def browser(size: tuple[int, int]):
    from selenium import webdriver

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        raise SystemExit("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", f"--window-size={size[0]},{size[1]}"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))


def submit_at_arrivals(server: Server, jobs, ids: list[str]) -> None:
    """Submit each job at its arrival time after the call (its workload id as its name)."""
    t0 = time.monotonic()
    for job in sorted(jobs, key=lambda j: j.arrival_s):
        time.sleep(max(0.0, t0 + job.arrival_s - time.monotonic()))
        body = {k: v for k, v in job.to_json().items() if k not in ("id", "arrival_s", "quick_spec")}
        ids.append(server.submit({**body, "name": job.id}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/img"), help="folder of the PNG files")
    parser.add_argument("--workload", default="mixed", help="workload name or file (default: the demo's)")
    parser.add_argument("--full", action="store_true", help="the workload's full variant (default: quick)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    jobs = load_workload(args.workload, quick=not args.full).jobs
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp) / "state", interval=10.0).start()
        page = browser(WIDE)
        try:
            ids: list[str] = []
            submitter = threading.Thread(target=submit_at_arrivals, args=(server, jobs, ids), daemon=True)
            submitter.start()
            page.get(server.url.replace("/api/v1", "/"))
            shots = {len(jobs) // 3: "dashboard.png", 2 * len(jobs) // 3: "dashboard-later.png"}
            deadline = time.monotonic() + RUN_LIMIT_S
            ended = 0
            while ended < len(jobs) and time.monotonic() < deadline:
                time.sleep(POLL_S)
                ended = sum(_ended(server.job(i)) for i in list(ids))
                for count in [c for c in shots if ended >= c]:
                    time.sleep(3.0)  # the page's charts redraw every few seconds
                    page.save_screenshot(str(args.out / shots.pop(count)))
                    log.info("%d of %d jobs ended: screenshot taken", ended, len(jobs))
            page.find_element("css selector", "#jobs tbody tr td.id button").click()  # the first job's panel
            time.sleep(3.0)
            page.save_screenshot(str(args.out / "dashboard-job.png"))
            narrow = browser(NARROW)
            try:
                narrow.get(server.url.replace("/api/v1", "/"))
                time.sleep(3.0)
                narrow.save_screenshot(str(args.out / "dashboard-narrow.png"))
            finally:
                narrow.quit()
        finally:
            page.quit()
            server.stop()
    log.info("screenshots in %s", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
