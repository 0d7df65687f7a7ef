"""Smoke tests of the simulation experiments' --quick variants."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from pollux_opt.backends.sim import default_trace_dir

TRACES = default_trace_dir()
needs_traces = pytest.mark.skipif(
    not (TRACES / "profiles").is_dir(), reason=f"AdaptDL traces not found at {TRACES}"
)


@needs_traces
def test_sim_compare_quick_completes_every_job_and_writes_its_table_plot_and_runs(tmp_path, experiment):
    experiment("sim_compare").main(["--quick", "--out", str(tmp_path), "--policies", "tiresias", "optimus"])
    df = pd.read_csv(tmp_path / "compare.csv")
    assert set(df.policy) == {"tiresias", "optimus"} and (df.completed == df.jobs).all()
    assert (tmp_path / "compare.png").stat().st_size > 0
    assert (tmp_path / "workload-1-tiresias" / "summary.json").is_file()


@pytest.mark.slow
@needs_traces
def test_sim_compare_quick_completes_every_pollux_job(tmp_path, experiment):
    experiment("sim_compare").main(["--quick", "--out", str(tmp_path), "--policies", "pollux"])
    df = pd.read_csv(tmp_path / "compare.csv")
    assert (df.completed == df.jobs).all()


@pytest.mark.slow
@needs_traces
def test_sim_sensitivity_quick_sweeps_every_axis_to_completion(tmp_path, experiment):
    experiment("sim_sensitivity").main(["--quick", "--out", str(tmp_path)])
    df = pd.read_csv(tmp_path / "sensitivity.csv")
    assert set(df.axis) == {"load", "interval_s", "restart_delay_s", "report_noise", "p"}
    assert (df.completed == df.jobs).all()


def test_sensitivity_axes_are_settings_the_policies_accept(experiment):
    mod = experiment("sim_sensitivity")
    for p in mod.AXES["p"]:
        assert mod._policy("pollux", p, mod.DEFAULTS["restart_delay_s"]).options.p == p
    for delay in mod.AXES["restart_delay_s"]:
        assert mod._policy("pollux", mod.DEFAULTS["p"], delay).options.restart_delay == max(delay, 1e-9)


def test_sim_scale_quick_completes_every_job_at_each_cluster_size(tmp_path, experiment):
    experiment("sim_scale").main(["--quick", "--out", str(tmp_path), "--policies", "tiresias"])
    df = pd.read_csv(tmp_path / "scale.csv")
    assert list(df.cpus) == [16, 32] and (df.completed == df.jobs).all()
    assert (tmp_path / "scale.png").is_file()


def test_sim_fidelity_matched_variant_charges_the_recorded_verification_and_start(tmp_path, experiment, recorded_runs):
    """The fidelity experiment replays a (hand-written) real run: profiles are
    exported, both variants simulated, and the matched one charges the
    measured verification time that the paper variant leaves out."""
    run, _ = recorded_runs.write(tmp_path / "demo", "fixed", {"n0": 2})
    config = json.loads((run / "config.json").read_text())
    config.update(policy="fixed", cluster=[{"id": "n0", "cpus": 2}], interval_s=10.0)
    (run / "config.json").write_text(json.dumps(config))
    (run / "summary.json").write_text(json.dumps({"avg_jct_s": 5.0}))
    table = experiment("sim_fidelity").fidelity([str(tmp_path / "demo")], tmp_path / "out")
    assert list(table.variant) == ["paper", "matched"] and (table.real_avg_jct_s == 5.0).all()
    paper, matched = table.sim_avg_jct_s
    # Matched: + the measured verification (2.5 s); its first start costs the
    # measured 0.3 s instead of the median rescale's 1.5 s (the run's events).
    assert paper > 0 and matched == pytest.approx(paper + 2.5 - (1.5 - 0.3))
    assert (tmp_path / "out" / "fidelity.csv").is_file() and (tmp_path / "out" / "fidelity.png").is_file()


def test_stage_timer_counts_an_override_and_the_method_it_calls_once(experiment):
    timer = experiment("encode_speed")._timer
    totals: dict = {}

    class Base:
        def jobs(self):
            return 1

    class Derived(Base):
        def jobs(self):
            return super().jobs() + 1

    Base.jobs = timer(totals, "policy_jobs_s", Base.jobs)
    Derived.jobs = timer(totals, "policy_jobs_s", Derived.jobs)
    assert Derived().jobs() == 2 and Base().jobs() == 1
    assert totals["policy_jobs_s"][2] == 2  # one call each, the nested base call not counted again


def test_stage_timer_keeps_the_signature_the_solver_registry_reads_options_from(experiment):
    import inspect

    timer = experiment("encode_speed")._timer

    class Solver:
        def __call__(self, problem, *, mip_gap=1e-4, time_limit=None):
            return mip_gap

    Solver.__call__ = timer({}, "solve_s", Solver.__call__)
    params = inspect.signature(Solver()).parameters.values()
    assert [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY] == ["mip_gap", "time_limit"]
    assert Solver()(None, mip_gap=1e-3) == 1e-3
