"""Smoke tests of the simulation experiments' --quick variants (issue 6)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

from pollux_opt._sim import default_trace_dir

ROOT = Path(__file__).resolve().parents[1]
TRACES = default_trace_dir()
needs_traces = pytest.mark.skipif(
    not (TRACES / "profiles").is_dir(), reason=f"AdaptDL traces not found at {TRACES}"
)


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@needs_traces
def test_sim_compare_quick(tmp_path):
    _load("sim_compare").main(["--quick", "--out", str(tmp_path), "--policies", "tiresias", "optimus"])
    df = pd.read_csv(tmp_path / "compare.csv")
    assert set(df.policy) == {"tiresias", "optimus"} and (df.completed == df.jobs).all()
    assert (tmp_path / "compare.png").stat().st_size > 0
    assert (tmp_path / "workload-1-tiresias" / "summary.json").is_file()


@pytest.mark.slow
@needs_traces
def test_sim_compare_quick_pollux(tmp_path):
    _load("sim_compare").main(["--quick", "--out", str(tmp_path), "--policies", "pollux"])
    df = pd.read_csv(tmp_path / "compare.csv")
    assert (df.completed == df.jobs).all()


@pytest.mark.slow
@needs_traces
def test_sim_sensitivity_quick(tmp_path):
    _load("sim_sensitivity").main(["--quick", "--out", str(tmp_path)])
    df = pd.read_csv(tmp_path / "sensitivity.csv")
    assert set(df.axis) == {"load", "interval_s", "restart_delay_s", "report_noise", "p"}
    assert (df.completed == df.jobs).all()


def test_sim_scale_quick(tmp_path):
    _load("sim_scale").main(["--quick", "--out", str(tmp_path), "--policies", "tiresias"])
    df = pd.read_csv(tmp_path / "scale.csv")
    assert list(df.cpus) == [16, 32] and (df.completed == df.jobs).all()
    assert (tmp_path / "scale.png").is_file()
