#!/usr/bin/env python
"""The dashboard measured against its targets in headless Chromium, written
to ``experiments/results/dashboard.csv`` (the rows of ``service.csv``'s shape).

1. *Load and live*: a real ``pollux-opt serve`` on 2 CPUs; the page's first
   load (the browser's navigation timing, over reloads) and, for quick jobs
   submitted one after another, the seconds from each job's ``succeeded``
   transition (the server's time) to its row showing it (the page's time, a
   MutationObserver; same machine, same clock).
2. *200 jobs and a 6-hour timeline*: the API in this process over a state of
   200 jobs on a 16 x 4-CPU cluster with 6 hours of rounds (one a minute) and
   reports; the page loaded, then scrolled from top to bottom and back in
   small steps while ``requestAnimationFrame`` times every frame.

    python experiments/dashboard_targets.py [--quick]
"""

from __future__ import annotations

import argparse
import csv
import logging
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from dashboard_screenshots import WIDE, browser  # noqa: E402
from service_targets import COLUMNS, RESULTS, Server, free_port, row  # noqa: E402

log = logging.getLogger("dashboard_targets")

#: A job that reaches its target in seconds of training.
QUICK_JOB = {"kind": "synth-regress", "replicas": 1, "batch_size": 32,
             "spec": {"target": 0.3, "eval_every": 20, "config": {"samples": 20_000, "width": 64}}}
#: The large state: jobs, nodes x CPUs, hours of history, seconds between rounds and between a job's reports.
JOBS, NODES, NODE_CPUS, HOURS, ROUND_S, REPORT_S = 200, 16, 4, 6.0, 60.0, 60.0
#: Seconds the page may take to show what it is waiting for.
WAIT_S = 120.0
SEED = 34
#: Scrolls the page down and back in steps, timing every animation frame; returns the frames' gaps, ms.
SCROLL_AND_TIME = """
const done = arguments[arguments.length - 1];
const gaps = [];
let last = performance.now();
let step = 0;
const steps = 120, height = document.documentElement.scrollHeight - innerHeight;
function frame(now) {
  gaps.push(now - last);
  last = now;
  step += 1;
  window.scrollTo(0, height * (step <= steps / 2 ? step : steps - step) / (steps / 2));
  if (step < steps) requestAnimationFrame(frame); else done(gaps.slice(1));
}
requestAnimationFrame(frame);
"""


def wait(page, script: str, what: str):
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        value = page.execute_script(script)
        if value:
            return value
        time.sleep(0.05)
    raise RuntimeError(f"the page did not show {what} within {WAIT_S} s")


def load_and_live(out: Path, jobs: int, reloads: int) -> list[dict]:
    """Measurement 1 (see the module docstring)."""
    server = Server(out / "live", interval=30.0).start()
    page = browser(WIDE)
    try:
        url = server.url.replace("/api/v1", "/")
        loads = []
        for _ in range(reloads):
            page.get(url)
            loads.append(page.execute_script("return performance.getEntriesByType('navigation')[0].duration"))
        page.execute_script("""window.seen = {};
            new MutationObserver(() => { for (const tr of document.querySelectorAll('#jobs tbody tr')) {
              const key = tr.dataset.id + ':' + tr.dataset.state; if (!(key in seen)) seen[key] = Date.now() / 1000; }
            }).observe(document.querySelector('#jobs tbody'), {childList: true, subtree: true});""")
        delays = []
        for _ in range(jobs):
            job_id = server.submit(QUICK_JOB)
            shown = wait(page, f"return window.seen['{job_id}:succeeded']", f"job {job_id} succeeded")
            ended = next(m["t"] for m in server.job(job_id)["transitions"] if m["new"] == "succeeded")
            delays.append(shown - ended)
            log.info("job %s: on the page %.3f s after its end", job_id, delays[-1])
    finally:
        page.quit()
        server.stop()
    return [row("page load and live events", "first load, median", float(np.median(loads)), "ms", 300.0,
                n=len(loads)),
            row("page load and live events", "event to page, median", float(np.median(delays)), "s", 1.0,
                n=len(delays)),
            row("page load and live events", "event to page, max", max(delays), "s", n=len(delays))]


def _large_state(directory: Path):
    """A store and index holding ``JOBS`` jobs and ``HOURS`` of rounds and reports (seeded)."""
    from pollux_opt.service.db import DB_FILE, EventIndex, Store

    rng = random.Random(SEED)
    store = Store(directory / DB_FILE)
    started = time.time() - HOURS * 3600
    index = EventIndex(directory / DB_FILE, started)
    for _ in range(JOBS):
        store.submit({"kind": "digits-cnn", "spec": {}, "weight": 1.0}, None, progress_target=1000.0,
                     init_batch_size=32)
    arrivals = sorted(rng.uniform(0, HOURS * 3600 * 0.9) for _ in range(JOBS))
    lengths = [rng.uniform(600, 3 * 3600) for _ in range(JOBS)]
    events = [{"t": a, "type": "submit", "job_id": str(i + 1), "kind": "digits-cnn"} for i, a in enumerate(arrivals)]
    events += [{"t": a + 1, "type": "start", "job_id": str(i + 1), "placement": {"n0": 2}}
               for i, a in enumerate(arrivals)]
    events += [{"t": a + n, "type": "complete", "job_id": str(i + 1), "verified": True, "value": 0.95}
               for i, (a, n) in enumerate(zip(arrivals, lengths)) if a + n < HOURS * 3600]
    cpus = NODES * NODE_CPUS
    for k in range(int(HOURS * 3600 / ROUND_S)):
        t = k * ROUND_S
        live = [i for i in range(JOBS) if arrivals[i] <= t < arrivals[i] + lengths[i]][:cpus // 2]
        placement = {str(i + 1): {f"n{(2 * n) // NODE_CPUS}": 2} for n, i in enumerate(live)}
        events.append({"t": t, "type": "allocation", "placement": placement, "objective": 1.0,
                       "solver_s": rng.uniform(0.01, 0.2)})
        events += [{"t": t + 1, "type": "report", "job_id": str(i + 1), "goodput": rng.uniform(50, 500),
                    "goodput_base": 100.0, "batch_size": rng.choice([32, 64, 128]), "progress": (t - arrivals[i]) / 10}
                   for i in live]
    events.sort(key=lambda e: e["t"])
    index.rebuild(events)
    return store, [{"id": f"n{n}", "cpus": NODE_CPUS} for n in range(NODES)]


def many_jobs(out: Path) -> list[dict]:
    """Measurement 2 (see the module docstring)."""
    import uvicorn

    from pollux_opt.service.app import make_app

    with tempfile.TemporaryDirectory(dir=out) as tmp:
        store, nodes = _large_state(Path(tmp))
        app = make_app(store, state_dir=Path(tmp), notify=None, cluster=nodes)
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.05)
        page = browser(WIDE)
        try:
            t0 = time.perf_counter()
            page.get(f"http://127.0.0.1:{port}/")
            wait(page, f"return document.querySelectorAll('#jobs tbody tr').length === {JOBS}", f"{JOBS} rows")
            wait(page, "return [...document.querySelectorAll('figure[data-chart]')].filter(f => "
                       "f.dataset.job === undefined && f.querySelector('.series')).length === 6", "every chart")
            ready = time.perf_counter() - t0
            page.set_script_timeout(60)
            gaps = page.execute_async_script(SCROLL_AND_TIME)
        finally:
            page.quit()
            server.should_exit = True
            thread.join(10)
            store.close()
    target = f"{JOBS} jobs and a {HOURS:g}-hour timeline"
    return [row(target, "table and charts drawn", ready, "s", n=1),
            row(target, "frame while scrolling, max", max(gaps), "ms", 100.0, n=len(gaps)),
            row(target, "frame while scrolling, p95", float(np.percentile(gaps, 95)), "ms", n=len(gaps))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer jobs and reloads (a check that it runs)")
    parser.add_argument("--csv", type=Path, default=RESULTS / "dashboard.csv", help="where the rows go")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        rows = load_and_live(Path(tmp), jobs=1 if args.quick else 5, reloads=2 if args.quick else 10)
        rows += many_jobs(Path(tmp))
    with open(args.csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    for r in rows:
        log.info("%s | %s: %.3f %s (limit %s)", r["target"], r["metric"], r["value"], r["unit"], r["limit"])
    log.info("wrote %s", args.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
