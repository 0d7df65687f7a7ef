"""Cluster-scale simulator on the shared scheduler loop.

Profiles (the hidden truth of simulated jobs), the simulation backend and a
one-call driver; workloads come from :mod:`pollux_opt.workloads`::

    from pollux_opt.backends.sim import default_trace_dir, load_profiles, simulate
    from pollux_opt.workloads import read_adaptdl_csv
    profiles = load_profiles()                          # ../shared/traces/adaptdl-osdi21
    jobs = read_adaptdl_csv(default_trace_dir() / "workloads" / "workload-6.csv")
    result = simulate(jobs, profiles, "tiresias", out_dir="runs/w6-tiresias")
"""

from pollux_opt.backends.sim.backend import SimBackend
from pollux_opt.backends.sim.state import Oracle, SimConfig
from pollux_opt.backends.sim.profile_files import load_profiles, load_trace_profile
from pollux_opt.backends.sim.traces import ParametricProfile, Profile, TraceProfile, default_trace_dir
from pollux_opt.backends.sim.run import SimResult, quiet_library_logs, run_tasks, simulate

__all__ = [
    "Oracle", "ParametricProfile", "Profile", "SimBackend", "SimConfig", "SimResult", "TraceProfile",
    "default_trace_dir", "load_profiles", "load_trace_profile", "quiet_library_logs", "run_tasks", "simulate",
]
