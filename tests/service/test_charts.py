"""The dashboard's charts: their series from a history, and the SVG drawn from them."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from pollux_opt.service.charts import CHARTS, JOB_ONLY, chart_series, render_svg

HISTORY = {
    "rounds": [{"t": 100.0, "solver_s": 0.01, "objective": 1.0, "placement": {"1": {"n0": 2}}},
               {"t": 160.0, "solver_s": 0.03, "objective": 1.5, "placement": {"1": {"n0": 1}, "2": {"n1": 3}}}],
    "transitions": [{"job_id": "1", "t": 90.0, "new": "queued"}, {"job_id": "2", "t": 95.0, "new": "queued"},
                    {"job_id": "1", "t": 100.0, "new": "rescaling"}, {"job_id": "1", "t": 105.0, "new": "running"},
                    {"job_id": "2", "t": 160.0, "new": "rescaling"}, {"job_id": "1", "t": 200.0, "new": "succeeded"}],
    "reports": [{"job_id": "1", "t": 110.0, "goodput": 50.0, "batch_size": 64, "replicas": 2, "throughput": 128.0,
                 "predicted_throughput": 160.0, "noise_scale": 96.0, "init_batch_size": 32, "max_batch_size": 512},
                {"job_id": "2", "t": 170.0, "goodput": 20.0, "batch_size": 32, "replicas": 3}],
}


def values(series) -> dict[str, list[tuple[float, float]]]:
    return {s.label: list(zip(s.xs, s.ys)) for s in series}


def test_each_chart_folds_the_history_into_step_series():
    assert values(chart_series("allocations", HISTORY, total_cpus=8)) == {
        "job 1": [(100.0, 2.0), (160.0, 1.0)], "job 2": [(100.0, 0.0), (160.0, 3.0)]}
    assert values(chart_series("utilisation", HISTORY, total_cpus=8)) == {"allocated": [(100.0, 25.0), (160.0, 50.0)]}
    assert values(chart_series("decisions", HISTORY, total_cpus=8)) == {"decision": [(100.0, 10.0), (160.0, 30.0)]}
    counts = values(chart_series("jobs", HISTORY, total_cpus=8))
    assert counts["queued"] == [(90.0, 1), (95.0, 2), (100.0, 1), (105.0, 1), (160.0, 0), (200.0, 0)]
    assert counts["running"] == [(90.0, 0), (95.0, 0), (100.0, 1), (105.0, 1), (160.0, 2), (200.0, 1)]
    assert values(chart_series("batch", HISTORY, total_cpus=8)) == {"job 1": [(110.0, 64.0)], "job 2": [(170.0, 32.0)]}
    goodput = dict(values(chart_series("goodput", HISTORY, total_cpus=8))["cluster"])
    assert (goodput[110.0], goodput[170.0], goodput[200.0]) == (50.0, 70.0, 20.0)  # the ended job stops counting


@pytest.mark.parametrize("name", sorted(CHARTS))
def test_every_chart_is_an_svg_with_its_unit_and_a_shape_per_series(name):
    series = chart_series(name, HISTORY, total_cpus=8, job="1" if name in JOB_ONLY else None)
    svg = render_svg(name, series, start=90.0, end=260.0, tz_offset_s=3600)
    root = ET.fromstring(svg)  # well-formed
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert CHARTS[name][1] in texts
    assert ("total batch size (samples)" if name == "efficiency" else "local time") in texts
    shapes = [e for e in root.iter() if e.get("class") == "series"]
    assert len(shapes) == len(series) and all(e.get("points") for e in shapes)


def test_an_empty_history_draws_axes_and_says_so():
    svg = render_svg("goodput", chart_series("goodput", {}, total_cpus=4), start=0.0, end=60.0)
    assert "nothing yet" in svg and 'class="series"' not in svg


def test_labels_are_escaped():
    from pollux_opt.service.charts import Series

    svg = render_svg("jobs", [Series("<b>&", (0.0,), (1.0,))], start=0.0, end=10.0)
    ET.fromstring(svg)
    assert "<b>&" not in svg and "&lt;b&gt;&amp;" in svg


def test_the_x_axis_is_in_the_viewers_time_zone():
    series = chart_series("utilisation", HISTORY, total_cpus=8)
    utc = render_svg("utilisation", series, start=0.0, end=3600.0 * 4, tz_offset_s=0)
    plus_two = render_svg("utilisation", series, start=0.0, end=3600.0 * 4, tz_offset_s=7200)
    assert ">00:00<" in utc and ">02:00<" in plus_two and ">00:00<" not in plus_two


def test_one_jobs_history_holds_its_own_moves_from_its_first_placement_on():
    from pollux_opt.service.charts import for_job

    mine = for_job(HISTORY, "2")
    assert [r["placement"] for r in mine["rounds"]] == [{"2": {"n1": 3}}]
    assert {m["job_id"] for m in mine["transitions"] + mine["reports"]} == {"2"}
    assert values(chart_series("allocations", for_job(HISTORY, "1"), total_cpus=8)) == {
        "job 1": [(100.0, 2.0), (160.0, 1.0)]}


def test_many_jobs_are_drawn_as_the_largest_ones_and_the_others_together():
    from pollux_opt.service.charts import SERIES_MAX

    jobs = [str(i) for i in range(3 * SERIES_MAX)]
    rounds = [{"t": float(t), "placement": {j: {"n0": 1 + (int(j) == t)} for j in jobs}} for t in range(5)]
    reports = [{"job_id": j, "t": float(t + int(j)), "batch_size": 32, "goodput": 1.0, "replicas": 1}
               for t in range(3) for j in jobs]
    history = {"rounds": rounds, "transitions": [], "reports": reports}
    stacked = chart_series("allocations", history, total_cpus=10**4)
    assert len(stacked) == SERIES_MAX and stacked[-1].label == f"{3 * SERIES_MAX - SERIES_MAX + 1} other jobs"
    # jobs 0-4 held 2 CPUs in one round, the others never: the first SERIES_MAX - 1 by CPU-seconds, in order
    assert [s.label for s in stacked[:-1]] == [f"job {j}" for j in range(SERIES_MAX - 1)]
    totals = [sum(s.ys[t] for s in stacked) for t in range(5)]
    assert totals == [float(3 * SERIES_MAX + 1)] * 5  # nothing lost in the sum
    batch = chart_series("batch", history, total_cpus=10**4)
    assert {s.label for s in batch} == {f"job {j}" for j in jobs[-SERIES_MAX:]}  # the last to report


def test_a_jobs_model_view_shows_measured_and_predicted_step_times_and_its_efficiency_curve():
    steps = values(chart_series("step_time", HISTORY, total_cpus=8, job="1"))
    assert steps == {"measured": [(110.0, 0.5)], "model": [(110.0, 0.4)]}  # 64 samples at 128 and 160 samples/s
    curve, now = chart_series("efficiency", HISTORY, total_cpus=8, job="1")
    assert curve.xs[0] == 32.0 and curve.xs[-1] == 512.0 and curve.ys[0] == 1.0  # E(M0) = 1
    assert curve.ys[-1] == pytest.approx((96 + 32) / (96 + 512))  # (phi + M0) / (phi + M), Pollux eq. 2
    assert all(a > b for a, b in zip(curve.ys, curve.ys[1:]))  # falls with the batch
    assert now.xs == (64.0, 64.0) and now.ys[1] == pytest.approx(128 / 160)
    assert chart_series("efficiency", HISTORY, total_cpus=8, job="2") == []  # no noise scale measured yet
