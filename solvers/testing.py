"""Seeded random instances and reference answers for testing and benchmarking solvers.

Everything here is deterministic given its ``rng`` (a :class:`numpy.random.Generator`
or an integer seed), so a failing hypothesis example or a benchmark row can be
rebuilt from its seed.

* :func:`random_problem`: a random cluster with concave speedup tables and some
  jobs currently running (the instances of ``experiments/solver_comparison.py``);
* :func:`random_typed_problem`: the same on a cluster with several node types
  (GPU models), each job with configurations on every type;
* :func:`random_placement`: a random *feasible* placement of a problem;
* :func:`brute_force`: the exact optimum of a tiny problem by enumeration;
* :func:`edge_problems`: small hand-made corner cases every solver must handle.

Example::

    import numpy as np
    from solvers import solve
    from solvers.testing import random_problem
    problem = random_problem(np.random.default_rng(0), num_nodes=16, cpus_per_node=4, num_jobs=40)
    solve(problem, "greedy").objective
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Iterator

import numpy as np

from .placement import evaluate, violations
from .problem import Problem

__all__ = [
    "speedup_model",
    "random_problem",
    "random_typed_problem",
    "random_placement",
    "brute_force",
    "edge_problems",
]

#: Pollux's default restart delay ``delta`` in seconds (OSDI 2021, section 4.2).
RESTART_DELAY = 30.0
#: Range of job ages in seconds for running jobs (one hour of history).
AGE_RANGE = (0.0, 3600.0)
#: Largest number of restarts a running job has already paid.
MAX_RESTARTS = 4
#: Range of the serial fraction ``alpha`` of the Amdahl-like speedup: 0.02
#: scales almost linearly, 0.5 saturates at 2x (small models that sync a lot).
ALPHA_RANGE = (0.02, 0.5)
#: Range of the per-extra-node slowdown ``beta``: crossing nodes costs 5-30 %
#: per node (inter-node sync is slower than intra-node, Pollux section 3.2).
BETA_RANGE = (0.05, 0.3)
#: Probability that a job asks for at least two replicas when started.
MIN_TWO_PROBABILITY = 0.2
#: Default cap on a job's max replicas, in nodes' worth of CPUs (keeps tables small).
MAX_REPLICAS_NODES = 4
#: Attempts to place one running job before leaving it idle.
PLACEMENT_ATTEMPTS = 8
#: Weights drawn uniformly in this range when ``weighted`` is true.
WEIGHT_RANGE = (0.5, 2.0)
#: Sia's 64-GPU heterogeneous cluster (SOSP 2023, section 6): nodes and GPUs per node of each type.
SIA_NODES = (6, 3, 2)
SIA_GPUS_PER_NODE = (4, 8, 8)
#: Relative speed of each node type in :func:`random_typed_problem` (type t: ``TYPE_SPEED[t % 3]``),
#: each job's factor jittered by ``TYPE_JITTER`` (jobs gain differently from a faster GPU).
TYPE_SPEED = (1.0, 1.6, 2.4)
TYPE_JITTER = 0.25


def _as_rng(rng: np.random.Generator | int) -> np.random.Generator:
    if isinstance(rng, np.random.Generator):
        return rng
    return np.random.default_rng(rng)


def speedup_model(nodes: np.ndarray, replicas: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    """Concave Amdahl-like speedup over one replica on one node.

    ``s(a, r) = r / (1 + alpha (r - 1)) / (1 + beta (a - 1))``: for a fixed node
    count ``a`` it is increasing and concave in the replica count ``r`` (for
    ``0 <= alpha <= 1``), ``s(1, 1) = 1``, and spreading the same replicas over
    more nodes costs a factor ``1 + beta`` per extra node.
    """
    nodes = np.asarray(nodes, dtype=np.float64)
    replicas = np.asarray(replicas, dtype=np.float64)
    return replicas / (1.0 + alpha * (replicas - 1.0)) / (1.0 + beta * (nodes - 1.0))


def random_problem(
    rng: np.random.Generator | int,
    num_nodes: int = 4,
    cpus_per_node: int = 4,
    num_jobs: int = 6,
    *,
    p: float = -1.0,
    running_fraction: float = 0.5,
    max_replicas_limit: int | None = None,
    max_nodes_per_job: int = 16,
    drop_fraction: float = 0.0,
    interference_avoidance: bool = True,
    weighted: bool = False,
    restart_delay: float = RESTART_DELAY,
) -> Problem:
    """A seeded random problem with concave speedup tables and some running jobs.

    Args:
        rng: generator or integer seed; the only source of randomness.
        num_nodes: N, nodes in the cluster.
        cpus_per_node: capacity of every node (CPUs or GPUs).
        num_jobs: J, jobs.
        p: fairness exponent of the power mean.
        running_fraction: probability that a job holds a (feasible) placement
            now; a job that does not fit stays idle.
        max_replicas_limit: largest max_replicas drawn (default: the CPUs of
            ``min(num_nodes, 4)`` nodes).
        max_nodes_per_job: the problem's max nodes per job.
        drop_fraction: probability of dropping each (nodes, replicas) pair from
            a job's table, to exercise "an absent pair is not allowed".
        interference_avoidance: the problem's interference rule.
        weighted: draw weights in ``WEIGHT_RANGE`` instead of all ones.
        restart_delay: ``delta`` in seconds for the restart factors.

    Returns:
        A :class:`Problem` whose ``current`` placement is feasible.  Each job's
        table lists every pair ``(a, r)`` with ``a <= r <= a * cpus_per_node``,
        ``a <= min(num_nodes, max_nodes_per_job)`` and ``r`` within its replica
        range, except the dropped ones, with speedups from :func:`speedup_model`.
    """
    gen = _as_rng(rng)
    if max_replicas_limit is None:
        max_replicas_limit = cpus_per_node * min(num_nodes, MAX_REPLICAS_NODES)
    jobs = _draw_jobs(gen, num_jobs, max_replicas_limit)
    span = min(num_nodes, max_nodes_per_job)
    cfg_job, cfg_nodes, cfg_reps, cfg_speed = _random_tables(
        gen, span, cpus_per_node, jobs.min_rep, jobs.max_rep, jobs.alpha, jobs.beta, drop_fraction
    )
    tables = dict(
        capacity=np.full(num_nodes, cpus_per_node, dtype=np.int64),
        cfg_job=np.array(cfg_job, dtype=np.int64),
        cfg_nodes=np.array(cfg_nodes, dtype=np.int64),
        cfg_replicas=np.array(cfg_reps, dtype=np.int64),
        cfg_speedup=np.array(cfg_speed, dtype=np.float64),
    )
    return _finish(gen, jobs, tables, restart_delay, weighted, running_fraction, p=p,
                   max_nodes_per_job=max_nodes_per_job, interference_avoidance=interference_avoidance)


def random_typed_problem(
    rng: np.random.Generator | int,
    nodes_per_type: tuple[int, ...] = SIA_NODES,
    capacity_per_type: tuple[int, ...] = SIA_GPUS_PER_NODE,
    num_jobs: int = 40,
    *,
    p: float = -1.0,
    running_fraction: float = 0.5,
    max_replicas_limit: int | None = None,
    max_nodes_per_job: int = 16,
    interference_avoidance: bool = True,
    weighted: bool = False,
) -> Problem:
    """A seeded random problem on a cluster of several node types, every job with configurations on each.

    Type t has ``nodes_per_type[t]`` nodes of ``capacity_per_type[t]`` CPUs
    (GPUs) each, listed type by type.  A job's speedup on type t is the
    concave :func:`speedup_model` times a per-(job, type) factor
    ``TYPE_SPEED[t % 3] * U(1 - TYPE_JITTER, 1 + TYPE_JITTER)``; its pairs on
    type t are those of :func:`random_problem` for that type's node count
    and capacity.  Some jobs run now (on one type each), as in
    :func:`random_problem`.

    Args:
        rng: generator or integer seed; the only source of randomness.
        nodes_per_type, capacity_per_type: the cluster (default: Sia's 64 GPUs).
        num_jobs: J, jobs.
        p, running_fraction, max_nodes_per_job, interference_avoidance, weighted:
            as for :func:`random_problem`.
        max_replicas_limit: largest max_replicas drawn (default: the CPUs of
            ``min(nodes, 4)`` nodes of the largest type).
    """
    gen = _as_rng(rng)
    counts, caps = np.asarray(nodes_per_type, dtype=np.int64), np.asarray(capacity_per_type, dtype=np.int64)
    if max_replicas_limit is None:
        max_replicas_limit = int(np.max(caps * np.minimum(counts, MAX_REPLICAS_NODES)))
    node_type = np.repeat(np.arange(counts.size), counts)
    jobs = _draw_jobs(gen, num_jobs, max_replicas_limit)
    speed = np.array([TYPE_SPEED[t % len(TYPE_SPEED)] for t in range(counts.size)])
    factor = speed * gen.uniform(1 - TYPE_JITTER, 1 + TYPE_JITTER, size=(num_jobs, counts.size))
    rows = []  # (job, type, nodes, replicas, speedup)
    for j in range(num_jobs):
        for t, (n_t, cap) in enumerate(zip(counts.tolist(), caps.tolist())):
            for a in range(1, min(n_t, max_nodes_per_job) + 1):
                r = np.arange(max(a, jobs.min_rep[j], 1), min(jobs.max_rep[j], a * cap) + 1)
                s = factor[j, t] * speedup_model(a, r, jobs.alpha[j], jobs.beta[j])
                rows += [(j, t, a, int(k), float(v)) for k, v in zip(r, s)]
    cfg = np.array(rows, dtype=np.float64).reshape(-1, 5)
    tables = dict(
        capacity=np.repeat(caps, counts),
        cfg_job=cfg[:, 0].astype(np.int64),
        cfg_nodes=cfg[:, 2].astype(np.int64),
        cfg_replicas=cfg[:, 3].astype(np.int64),
        cfg_speedup=cfg[:, 4],
        node_type=node_type,
        cfg_type=cfg[:, 1].astype(np.int64),
    )
    return _finish(gen, jobs, tables, RESTART_DELAY, weighted, running_fraction, p=p,
                   max_nodes_per_job=max_nodes_per_job, interference_avoidance=interference_avoidance)


@dataclasses.dataclass(frozen=True)
class _Jobs:
    """Per-job draws of the random problems: int64[J] replica range, float64[J] speedup shape."""

    max_rep: np.ndarray
    min_rep: np.ndarray
    alpha: np.ndarray
    beta: np.ndarray


def _draw_jobs(gen: np.random.Generator, num_jobs: int, max_replicas_limit: int) -> _Jobs:
    """Replica ranges and speedup shapes of ``num_jobs`` jobs (the first draws of every random problem)."""
    max_rep = gen.integers(1, max_replicas_limit + 1, size=num_jobs)
    min_rep = np.where((gen.random(num_jobs) < MIN_TWO_PROBABILITY) & (max_rep >= 2), 2, gen.integers(0, 2, size=num_jobs))
    alpha = gen.uniform(*ALPHA_RANGE, size=num_jobs)
    beta = gen.uniform(*BETA_RANGE, size=num_jobs)
    return _Jobs(max_rep, min_rep, alpha, beta)


def _finish(
    gen: np.random.Generator, jobs: _Jobs, tables: dict, restart_delay: float, weighted: bool, running_fraction: float, **rest
) -> Problem:
    """The :class:`Problem` of ``tables`` (cluster and configurations) with drawn ages, restarts,
    weights and a feasible current placement of the jobs drawn to run (the last draws, in this order)."""
    num_jobs = jobs.max_rep.size
    age = gen.uniform(*AGE_RANGE, size=num_jobs)
    restarts = gen.integers(0, MAX_RESTARTS + 1, size=num_jobs)
    problem = Problem(
        **tables,
        current=np.zeros((num_jobs, tables["capacity"].size), dtype=np.int64),
        restart_factor=np.maximum(age - restarts * restart_delay, 0.0) / (age + restart_delay),
        weight=gen.uniform(*WEIGHT_RANGE, size=num_jobs) if weighted else np.ones(num_jobs),
        min_replicas=jobs.min_rep,
        max_replicas=jobs.max_rep,
        **rest,
    )
    running = gen.random(num_jobs) < running_fraction
    return dataclasses.replace(problem, current=_place_jobs(gen, problem, np.flatnonzero(running)))


def _random_tables(
    gen: np.random.Generator,
    span: int,
    cpus_per_node: int,
    min_rep: np.ndarray,
    max_rep: np.ndarray,
    alpha: np.ndarray,
    beta: np.ndarray,
    drop_fraction: float,
) -> tuple[list, list, list, list]:
    """(job, nodes, replicas, speedup) of every configuration, job by job, each dropped w.p. ``drop_fraction``.

    A job's pairs ``(a, r)`` have ``a <= span`` nodes and ``max(a, min_rep, 1) <= r
    <= min(max_rep, a * cpus_per_node)``; one uniform is drawn per pair, in this order.
    """
    cfg_job, cfg_nodes, cfg_reps, cfg_speed = [], [], [], []
    for j in range(min_rep.size):
        for a in range(1, span + 1):
            lo = max(a, min_rep[j], 1)
            hi = min(max_rep[j], a * cpus_per_node)
            for r in range(lo, hi + 1):
                if gen.random() < drop_fraction:
                    continue
                cfg_job.append(j)
                cfg_nodes.append(a)
                cfg_reps.append(r)
                cfg_speed.append(float(speedup_model(a, r, alpha[j], beta[j])))
    return cfg_job, cfg_nodes, cfg_reps, cfg_speed


def _place_jobs(gen: np.random.Generator, problem: Problem, jobs: np.ndarray) -> np.ndarray:
    """Place ``jobs`` one by one on a random allowed configuration that fits."""
    x = np.zeros((problem.num_jobs, problem.num_nodes), dtype=np.int64)
    free = problem.capacity.copy()
    has_multi = np.zeros(problem.num_nodes, dtype=bool)
    start = problem.cfg_start
    for j in jobs:
        cfgs = np.arange(start[j], start[j + 1])
        if cfgs.size == 0:
            continue
        for _ in range(PLACEMENT_ATTEMPTS):
            c = gen.choice(cfgs)
            a, r = int(problem.cfg_nodes[c]), int(problem.cfg_replicas[c])
            ok = (free > 0) & (problem.node_type == problem.cfg_type[c])
            if a > 1 and problem.interference_avoidance:
                ok &= ~has_multi
            eligible = np.flatnonzero(ok)
            if eligible.size < a:
                continue
            nodes = gen.choice(eligible, size=a, replace=False)
            if free[nodes].sum() < r:
                continue
            row = np.ones(a, dtype=np.int64)
            for _ in range(r - a):
                room = np.flatnonzero(row < free[nodes])
                row[gen.choice(room)] += 1
            x[j, nodes] = row
            free[nodes] -= row
            if a > 1:
                has_multi[nodes] = True
            break
    return x


def random_placement(
    rng: np.random.Generator | int, problem: Problem, fill_fraction: float = 1.0
) -> np.ndarray:
    """A random feasible placement int64[J, N] (jobs placed in random order).

    Each job is tried with probability ``fill_fraction`` on random allowed
    configurations that still fit; jobs that do not fit hold nothing.
    """
    gen = _as_rng(rng)
    order = gen.permutation(problem.num_jobs)
    chosen = order[gen.random(problem.num_jobs) < fill_fraction]
    return _place_jobs(gen, problem, chosen)


def _job_rows(problem: Problem, j: int) -> list[np.ndarray]:
    """Every row (replicas per node) job j may take alone: zero or an allowed (type, nodes, replicas)."""
    rows = [np.zeros(problem.num_nodes, dtype=np.int64)]
    sl = slice(problem.cfg_start[j], problem.cfg_start[j + 1])
    allowed = set(zip(problem.cfg_type[sl].tolist(), problem.cfg_nodes[sl].tolist(), problem.cfg_replicas[sl].tolist()))
    ranges = [range(int(c) + 1) for c in problem.capacity]
    for combo in itertools.product(*ranges):
        row = np.array(combo, dtype=np.int64)
        types = set(problem.node_type[row > 0].tolist())
        if len(types) != 1:
            continue  # empty (listed first) or on several types
        key = (types.pop(), int((row > 0).sum()), int(row.sum()))
        if key in allowed:
            rows.append(row)
    return rows


def brute_force(problem: Problem, max_placements: int = 2_000_000) -> tuple[float, np.ndarray]:
    """Exact optimum of a tiny problem by enumerating every feasible placement.

    Returns:
        (objective, placement) of the best placement (ties: the first found).

    Raises:
        ValueError: if the product of per-job choices exceeds ``max_placements``.
    """
    rows = [_job_rows(problem, j) for j in range(problem.num_jobs)]
    total = math.prod(len(r) for r in rows)
    if total > max_placements:
        raise ValueError(f"brute_force: {total} placements > max_placements={max_placements}")
    best_obj, best_x = -math.inf, np.zeros_like(problem.current)
    x = np.zeros((problem.num_jobs, problem.num_nodes), dtype=np.int64)

    def visit(j: int, free: np.ndarray) -> None:
        nonlocal best_obj, best_x
        if j == problem.num_jobs:
            if not violations(problem, x):
                obj = evaluate(problem, x)
                if obj > best_obj:
                    best_obj, best_x = obj, x.copy()
            return
        for row in rows[j]:
            if np.all(row <= free):
                x[j] = row
                visit(j + 1, free - row)
        x[j] = 0

    visit(0, problem.capacity.copy())
    return float(best_obj), best_x


def edge_problems() -> Iterator[tuple[str, Problem]]:
    """Small hand-made corner cases, as (name, problem) pairs.

    * ``no_jobs``: a cluster with no jobs;
    * ``no_configs``: a job with no allowed configuration (it can only hold nothing);
    * ``invalid_current``: a running job whose current placement is not an
      allowed configuration (so keeping it is not an option);
    * ``shared_multi_node``: two multi-node jobs sharing a node now, which the
      interference rule forbids;
    * ``holes``: a table with holes (only 1 and 4 replicas on one node, 4 on two);
    * ``p_zero`` / ``p_positive``: the geometric and a utilitarian mean.
    """
    yield "no_jobs", Problem(
        capacity=[4, 4],
        cfg_job=np.zeros(0),
        cfg_nodes=np.zeros(0),
        cfg_replicas=np.zeros(0),
        cfg_speedup=np.zeros(0),
        current=np.zeros((0, 2)),
        restart_factor=np.zeros(0),
        weight=np.zeros(0),
        min_replicas=np.zeros(0),
        max_replicas=np.zeros(0),
    )
    yield "no_configs", Problem(
        capacity=[2],
        cfg_job=[1],
        cfg_nodes=[1],
        cfg_replicas=[1],
        cfg_speedup=[1.0],
        current=[[0], [0]],
        restart_factor=[0.5, 0.5],
        weight=[1.0, 1.0],
        min_replicas=[0, 0],
        max_replicas=[2, 2],
    )
    yield "invalid_current", Problem(
        capacity=[2, 2],
        cfg_job=[0, 1, 1],
        cfg_nodes=[1, 1, 1],
        cfg_replicas=[1, 1, 2],
        cfg_speedup=[1.0, 1.0, 1.5],
        current=[[1, 1], [0, 0]],
        restart_factor=[0.9, 0.9],
        weight=[1.0, 1.0],
        min_replicas=[0, 0],
        max_replicas=[2, 2],
    )
    yield "shared_multi_node", Problem(
        capacity=[4, 4, 4],
        cfg_job=[0, 0, 1, 1],
        cfg_nodes=[1, 2, 1, 2],
        cfg_replicas=[2, 4, 2, 4],
        cfg_speedup=[1.8, 3.0, 1.8, 3.0],
        current=[[2, 2, 0], [0, 2, 2]],
        restart_factor=[0.8, 0.8],
        weight=[1.0, 1.0],
        min_replicas=[0, 0],
        max_replicas=[4, 4],
    )
    yield "holes", Problem(
        capacity=[4, 4],
        cfg_job=[0, 0, 0, 1, 1],
        cfg_nodes=[1, 1, 2, 1, 1],
        cfg_replicas=[1, 4, 4, 1, 4],
        cfg_speedup=[1.0, 3.0, 2.5, 1.0, 3.2],
        current=[[0, 0], [3, 0]],
        restart_factor=[0.7, 0.7],
        weight=[1.0, 2.0],
        min_replicas=[0, 0],
        max_replicas=[4, 4],
    )
    yield "p_zero", random_problem(1, num_nodes=3, cpus_per_node=2, num_jobs=4, p=0.0)
    yield "p_positive", random_problem(2, num_nodes=3, cpus_per_node=2, num_jobs=4, p=1.0)
