"""Wall time of one 160-job AdaptDL workload simulated under Pollux.

Run with ``pytest benchmarks/test_sim_bench.py --benchmark``.  The
target is <= 60 s per workload on the project's 2-core machine (Pollux's own
simulator takes about 30 minutes).  Skipped where the AdaptDL traces are absent.
``extra_info`` records the rounds, the policy's seconds (building the problem,
MILP, decoding) and the average JCT, so that a speed-up that changed the
schedule shows up.
"""

from __future__ import annotations

import logging

import pytest

from pollux_opt import Cluster
from pollux_opt.backends.sim import default_trace_dir, load_profiles, simulate
from pollux_opt.workloads.adaptdl import read_adaptdl_csv
from pollux_opt.backends.sim.state import SIM_DEFAULT_CPUS_PER_NODE, SIM_DEFAULT_INTERVAL_S, SIM_DEFAULT_NODES

TRACES = default_trace_dir()
#: The workload with a published per-workload figure (Pollux JCT 2446 s).
WORKLOAD = "workload-6"


@pytest.mark.skipif(not (TRACES / "profiles").is_dir(), reason=f"AdaptDL traces not found at {TRACES}")
def test_simulate_pollux_workload6(benchmark):
    logging.disable(logging.WARNING)
    profiles = load_profiles(TRACES)
    jobs = read_adaptdl_csv(TRACES / "workloads" / f"{WORKLOAD}.csv")

    def run():
        cluster = Cluster.uniform(SIM_DEFAULT_NODES, SIM_DEFAULT_CPUS_PER_NODE)
        return simulate(jobs, profiles, "pollux", cluster=cluster, interval=SIM_DEFAULT_INTERVAL_S)

    result = benchmark.pedantic(run, rounds=1, iterations=1, warmup_rounds=0)
    benchmark.extra_info.update(
        rounds=result.rounds, policy_seconds=result.solver_seconds, avg_jct_s=result.avg_jct,
        completed=result.completed,
    )
    assert result.completed == len(jobs)
