"""Cluster-scale simulator on the shared scheduler loop (private; issue 6).

Profiles (the hidden truth of simulated jobs), workloads, the simulation
backend and a one-call driver::

    from pollux_opt.backends.sim import load_profiles, read_workload, simulate
    profiles = load_profiles()                          # ../shared/traces/adaptdl-osdi21
    jobs = read_workload(default_trace_dir() / "workloads" / "workload-6.csv")
    result = simulate(jobs, profiles, "tiresias", out_dir="runs/w6-tiresias")
"""

from pollux_opt.backends.sim.backend import Oracle, SimBackend, SimConfig, split_batch
from pollux_opt.backends.sim.traces import (
    APP_SETTINGS,
    AppSettings,
    ParametricProfile,
    Profile,
    TraceProfile,
    default_trace_dir,
    load_profiles,
    load_trace_profile,
)
from pollux_opt.backends.sim.run import SIM_POLICIES, SimResult, make_policy, quiet_library_logs, run_tasks, simulate
from pollux_opt.workloads.adaptdl import WorkloadJob, philly_workload, read_workload, tuned_config, write_workload

__all__ = [
    "APP_SETTINGS", "AppSettings", "Oracle", "ParametricProfile", "Profile", "SIM_POLICIES",
    "SimBackend", "SimConfig", "SimResult", "TraceProfile", "WorkloadJob", "default_trace_dir",
    "load_profiles", "load_trace_profile", "make_policy", "philly_workload", "quiet_library_logs",
    "read_workload", "run_tasks", "simulate", "split_batch", "tuned_config", "write_workload",
]
