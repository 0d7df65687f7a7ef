"""The speed-ups of a Pollux simulation keep its behaviour.

* ``GoodputModel.optimize`` solves each distinct (one node or several, K) once;
* ``allocate`` keeps the batch configurations found while building the
  speedup table and reuses them to decode the placement;
* the simulator fits each distinct measurement set once;
* the MILP reuses a compiled model structure between rounds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pollux_opt import Cluster, Job
from pollux_opt.model.configs import batch_config, model_table
from pollux_opt.model import BatchLimits, GoodputModel, GradientStats, ThroughputParams
from pollux_opt.scheduling.loop import Decision
from pollux_opt.backends.sim import ParametricProfile, SimBackend, simulate
from pollux_opt.workloads import WorkloadJob
import pollux_opt.backends.sim.backend as sim_backend
from pollux_opt.agent.measurements import Measurements


def _model(phi_var=2.0):
    return GoodputModel(
        ThroughputParams(0.02, 0.003, 0.01, 0.002, 0.08, 0.01, 2.5),
        GradientStats(1.0, phi_var, 128),
        BatchLimits(128, 8192, min_local_bsz=8, max_local_bsz=256),
    )


def _fields(choice, i=None):
    names = ("goodput", "throughput", "efficiency", "local_bsz", "accum_steps", "batch_size")
    return [np.asarray(getattr(choice, f)) if i is None else np.asarray(getattr(choice, f))[i] for f in names]


def test_optimize_vectorised_equals_one_pair_calls():
    model = _model()
    nodes = np.array([1, 1, 2, 3, 7, 16, 2, 5, 1])
    reps = np.array([1, 4, 2, 3, 20, 64, 64, 40, 3])
    together = model.optimize(nodes, reps)
    for i, (n, k) in enumerate(zip(nodes, reps)):
        alone = model.optimize(int(n), int(k))
        for a, b in zip(_fields(together, i), _fields(alone)):
            assert a == b, (n, k)


def test_optimize_depends_on_nodes_only_through_one_or_several():
    model = _model()
    for k in (4, 9, 33):
        c2, c5 = model.optimize(2, k), model.optimize(min(k, 5), k)
        assert all(a == b for a, b in zip(_fields(c2), _fields(c5)))
    # ... but one node differs from several (intra- vs inter-node sync).
    assert model.optimize(1, 4).goodput != model.optimize(2, 4).goodput


def test_optimize_keeps_shape_and_scalar():
    model = _model()
    grid = model.optimize(np.array([[1], [2]]), np.array([2, 8, 32]))
    assert grid.goodput.shape == (2, 3) and grid.local_bsz.dtype == np.int64
    assert model.optimize(1, 1).goodput.shape == ()


def test_model_table_matches_speedup_and_optimize():
    model = _model()
    pairs = tuple((n, k) for n in range(1, 5) for k in range(n, 17))
    table, _ = model_table(model, pairs, (1, 1), None)
    spd = model.speedup([p[0] for p in pairs], [p[1] for p in pairs])
    assert set(table) == {p for p, s in zip(pairs, spd) if s > 0}
    job = Job("a", model, max_replicas=16)
    for p, s in zip(pairs, spd):
        if s > 0:
            assert table[p] == pytest.approx(float(s), rel=1e-12)
            one = model.optimize(*p)
            c = batch_config(job.speedup, pairs, job.base, None, p)
            assert (c.local_bsz, c.accum_steps, c.batch_size) == (int(one.local_bsz), int(one.accum_steps), int(one.batch_size))
            assert c.goodput == pytest.approx(float(one.goodput), rel=1e-12)


def test_identical_measurements_are_fitted_once(monkeypatch):
    calls = []
    real_fit = Measurements.fit

    def counting_fit(self, *args, **kwargs):
        calls.append(1)
        return real_fit(self, *args, **kwargs)

    monkeypatch.setattr(Measurements, "fit", counting_fit)
    profiles = {"synth": ParametricProfile("synth", max_epochs=3, epoch_progress=200.0)}
    jobs = [WorkloadJob(f"j{i}", "synth", 0.0, 1, 128) for i in range(3)]
    b = SimBackend(jobs, profiles, Cluster.uniform(1, 4))
    b.apply(Decision({f"j{i}": {"n0": 1} for i in range(3)}, math.nan, 0.0, "t"))
    b.advance(60.0)
    views = b.views()
    assert len(calls) == 1  # three jobs, one measurement set
    params = {v.goodput_model.throughput_params for v in views}
    assert len(params) == 1


def test_fit_cache_keeps_simulation_result(monkeypatch):
    profiles = {"synth": ParametricProfile("synth", max_epochs=4, epoch_progress=300.0)}
    jobs = [WorkloadJob(f"j{i}", "synth", 20.0 * (i % 3), 2, 256) for i in range(6)]
    cached = simulate(jobs, profiles, "pollux", cluster=Cluster.uniform(2, 4), interval=60.0)

    real_agent = sim_backend.JobAgent

    def agent_without_cache(*args, **kwargs):
        return real_agent(*args, **{**kwargs, "fit_cache": None})

    monkeypatch.setattr(sim_backend, "JobAgent", agent_without_cache)
    fresh = simulate(jobs, profiles, "pollux", cluster=Cluster.uniform(2, 4), interval=60.0)
    assert cached.completed == fresh.completed == len(jobs)
    assert cached.avg_jct == fresh.avg_jct and cached.makespan == fresh.makespan


def test_structure_cache_keeps_simulation_result(monkeypatch):
    import solvers
    from solvers.milp.compiled import STRUCTURE_CACHE_SIZE, StructureCache

    milp = solvers.SOLVERS["milp"].solver  # the registry's solver, whose structures every round shares
    profiles = {"synth": ParametricProfile("synth", max_epochs=4, epoch_progress=300.0)}
    jobs = [WorkloadJob(f"j{i}", "synth", 20.0 * (i % 3), 2, 256) for i in range(6)]
    monkeypatch.setattr(milp, "structures", StructureCache(STRUCTURE_CACHE_SIZE))
    cached = simulate(jobs, profiles, "pollux", cluster=Cluster.uniform(2, 4), interval=60.0)
    assert milp.structures.hits > 0  # consecutive rounds shared a structure
    monkeypatch.setattr(milp, "structures", StructureCache(0))
    fresh = simulate(jobs, profiles, "pollux", cluster=Cluster.uniform(2, 4), interval=60.0)
    assert cached.completed == fresh.completed == len(jobs)
    assert cached.avg_jct == fresh.avg_jct and cached.makespan == fresh.makespan
