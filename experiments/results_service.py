"""The service's and the dashboard's sections of ``docs/results.md``
(:mod:`results_doc` renders them): ``pollux-opt serve`` measured against its
targets by ``experiments/service_targets.py`` (``service.csv``), its dashboard
by ``experiments/dashboard_targets.py`` (``dashboard.csv``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from results_format import machine_note, md_table, missing

if TYPE_CHECKING:
    from results_doc import Results

#: How each measurement was made, by a phrase of its ``target`` (the counts in the targets vary with the run).
HOW = {
    "submit to first replica": "a server on 2 CPUs whose rounds come every 30 s, so that only the wake-up on a "
                               "submission starts a job at once; quick `synth-regress` jobs submitted one after "
                               "another (each once the one before ended), timed from just before the POST to the "
                               "job's `running` transition: its first replica formed and training",
    "submissions from": "threads submitting as fast as they can, each with its own HTTP client, to a server on 2 "
                        "CPUs where two `digits-cnn` jobs train, while another process polls `GET /api/v1/jobs` "
                        "and `GET /healthz` (a route that does no work: the floor of the loaded machine) in turn; "
                        "bursts on fresh servers, latencies pooled; a job is lost if its acknowledged id is "
                        "missing from the job list afterwards",
    "queued jobs": "the server's scheduling round on a simulated 16 x 4-CPU cluster, in one process with stand-in "
                   "jobs that hold their CPUs without training, once served (the queue in `service.db`) and once "
                   "as a closed workload of the same jobs; the decision is the policy's time, the whole round "
                   "also reads the jobs and applies the placement; means over the rounds after the first",
    "SIGKILLs of the server": "real jobs of mixed kinds on 2 CPUs, the server's process group killed with SIGKILL "
                              "(its worker pool, detached by setsid, ends by its watchdog, rank 0 saving its "
                              "step first) at seeded random moments and restarted at once on "
                              "the same state, some kills while a submission was in flight (retried with its "
                              "idempotency key); a job is lost unless it ended succeeded and verified, run twice if "
                              "the log has two `submit` or `complete` events for it; a restarted job may repeat "
                              "the steps since its last checkpoint (at most "
                              "`checkpoint_interval_s` of training), and a step repeated otherwise or beyond that "
                              "is lost",
}
#: How each of the dashboard's measurements was made, by a phrase of its ``target``.
DASHBOARD_HOW = {
    "page load": "`pollux-opt serve` on 2 CPUs and the page in headless Chromium at 1280 x 800: the first load is "
                 "the browser's navigation timing over reloads; quick jobs submitted one after another, each "
                 "timed from its `succeeded` transition (the server's clock) to its row showing it (the page's, "
                 "the same machine's)",
    "timeline": "the API in the measuring process over a made-up state (jobs arriving over the hours on a 16 x "
                "4-CPU cluster, a round a minute, each running job's report a minute), the page loaded until its "
                "table and every chart drew, then scrolled to the bottom and back in 120 steps, one an animation "
                "frame, every frame's time taken with `requestAnimationFrame`",
}
#: Metrics whose limit is a floor, by their first word (every other limit is a ceiling).
AT_LEAST = frozenset({"accepted"})


def _value(v, unit: str) -> str:
    if missing(v):
        return "-"
    v = float(v)
    if unit == "s":
        return f"{v:.3f} s" if v < 10 else f"{v:.1f} s"
    if unit == "ms":
        return f"{v:.1f} ms"
    if unit == "x":
        return f"{v:.2f} x"
    return f"{v:.0f} {unit}"


def _met(passed) -> str:
    if missing(passed) or str(passed) == "":
        return ""
    return "yes" if str(passed) == "True" else "**no**"


def _cold_start(df) -> list[str]:
    """A sentence on the first (cold worker pool) start against the others, where both were measured."""
    first = df[df.metric == "first (fresh server)"]
    others = df[df.metric == "median of the others"]
    if first.empty or others.empty:
        return []
    a, b = float(first.value.iloc[0]), float(others.value.iloc[0])
    verdict = "about the same as" if abs(a - b) <= max(0.1, 0.25 * b) else ("slower than" if a > b else "faster than")
    return [f"The first job, submitted to a freshly started server (its worker pool and the job's code not yet "
            f"loaded), reached `running` in "
            f"{_value(a, 's')}: {verdict} the median of the others ({_value(b, 's')}).", ""]


def _floor(df) -> list[str]:
    """A sentence on ``GET /api/v1/jobs``'s p99 against the no-op route's under the
    same load, where both were measured."""
    jobs, floor = (df[df.metric == f"GET {route} p99{tail}"] for route, tail in (("/api/v1/jobs", ""),
                                                                                  ("/healthz", " (floor)")))
    if jobs.empty or floor.empty:
        return []
    a, b = float(jobs.value.iloc[0]), float(floor.value.iloc[0])
    machine = ("the loaded machine's (two vCPUs shared by two training jobs, eight submitting clients, the polling "
               "client and the server)")
    verdict = (f"the tail is {machine}, not the job list's" if a - b <= max(5.0, 0.25 * b)
               else f"the job list adds {_value(a - b, 'ms')} to the tail of {machine}")
    return [f"Under the burst, `GET /healthz`, which does no work, had a p99 of {_value(b, 'ms')} and "
            f"`GET /api/v1/jobs` one of {_value(a, 'ms')}: {verdict}.", ""]


def _targets_table(df) -> list[str]:
    """The rows of a targets CSV as a table: measured, limit, met."""
    rows = []
    for r in df.itertuples():
        limit = "-" if missing(r.limit) or str(r.limit) == "" else (
            f"{'>=' if str(r.metric).split()[0] in AT_LEAST else '<='} {_value(r.limit, r.unit)}")
        rows.append([str(r.target), str(r.metric), _value(r.value, r.unit), limit, _met(r.passed),
                     "" if missing(r.n) else f"{float(r.n):.0f}"])
    return md_table(["target", "figure", "measured", "limit", "met", "n"], rows,
                    [False, False, True, True, False, True])


def _how_lines(df, how: dict[str, str]) -> list[str]:
    """A bullet on how each target of ``df`` was measured (``how``: by a phrase of the target)."""
    lines = []
    for target in dict.fromkeys(df.target):
        text = next((text for phrase, text in how.items() if phrase in target), None)
        if text is not None:
            lines.append(f"* **{target}**: {text}.")
    return lines


def _targets_section(df, title: str, intro: str, how: dict[str, str]) -> list[str]:
    """A section of a targets CSV: its title, what measured it (with the machine), how, and the table."""
    return [f"## {title}", "", f"{intro}{machine_note(df)}", "", *_how_lines(df, how), "", *_targets_table(df), ""]


def service_section(results: Results) -> list[str]:
    """The targets of ``service.csv`` as a table (measured, limit, met), each measurement explained."""
    df = results.service
    if df is None:
        return []
    intro = ("`experiments/service_targets.py`: `pollux-opt serve` (see [`docs/service.md`](service.md)) as a "
             "subprocess on this machine, driven over HTTP, except the rounds with many queued jobs, measured in "
             "one process.")
    return [*_targets_section(df, "The service", intro, HOW), *_cold_start(df), *_floor(df)]


def dashboard_section(results: Results) -> list[str]:
    """The targets of ``dashboard.csv`` as a table, each measurement explained."""
    df = results.dashboard
    if df is None:
        return []
    intro = ("`experiments/dashboard_targets.py`: the page of [`docs/dashboard.md`](dashboard.md) in headless "
             "Chromium (Debian's `chromium` and `chromium-driver`, through Selenium).")
    return _targets_section(df, "The dashboard", intro, DASHBOARD_HOW)
