"""Seeded instances at the edges of the problem's domain, for fuzzing and scaling tests.

* :func:`extreme_fields`: the fields of a small random problem whose numbers
  sit at (and sometimes just past) the bounds of the domain
  (:data:`~solvers.problem.P_RANGE`, :data:`~solvers.problem.WEIGHT_RANGE`,
  :data:`~solvers.problem.MAX_CPUS`, ...): tiny and extreme ``p``, weights
  at both ends, speedups from 0 to ``MAX_SPEEDUP``, huge capacities and
  replica counts.  ``Problem(**fields)`` either builds or raises
  :class:`~solvers.InvalidProblem`;
* :func:`large_problem`: a vectorised random problem with many jobs (200 000
  jobs on 64 nodes build in seconds, where :func:`solvers.testing.random_problem`
  loops in Python per configuration).

Deterministic given ``rng`` (a :class:`numpy.random.Generator` or an integer seed).
"""

from __future__ import annotations

import numpy as np

from .problem import MAX_CPUS, MAX_REPLICAS, MAX_SPEEDUP, P_RANGE, WEIGHT_RANGE, Problem
from .testing import ALPHA_RANGE, BETA_RANGE, speedup_model

__all__ = ["EXTREME_P", "OUT_OF_DOMAIN_FRACTION", "extreme_fields", "large_problem"]

#: Exponents drawn by :func:`extreme_fields`: the ends of P_RANGE, tiny ones
#: (which once made the MILP call a poor placement optimal) and ordinary ones.
EXTREME_P = (P_RANGE[0], -4.0, -1.0, -1e-7, -1e-300, 0.0, 1e-12, 1e-8, 1e-6, 0.5, 1.0, 2.0, P_RANGE[1])
#: Capacities drawn (per problem, then jittered per node).
EXTREME_CPUS = (1, 2, 4, 1000, 10**6, 10**9, MAX_CPUS)
#: Speedup scales drawn (per job): the concave model times one of these, clipped to MAX_SPEEDUP.
EXTREME_SPEEDUP_SCALES = (0.0, 1e-9, 1e-3, 1.0, 1e3, 1e6, MAX_SPEEDUP)
#: Weights drawn (per job).
EXTREME_WEIGHTS = (WEIGHT_RANGE[0], 1e-3, 1.0, 1e3, WEIGHT_RANGE[1])
#: Probability that :func:`extreme_fields` puts one field just outside the domain.
OUT_OF_DOMAIN_FRACTION = 0.1
#: Values just outside the domain, by field.
OUT_OF_DOMAIN = {
    "p": (np.nextafter(P_RANGE[0], -np.inf), 1e6, -1e6, float("nan")),
    "weight": (0.0, WEIGHT_RANGE[0] / 2, WEIGHT_RANGE[1] * 2, 1e308, float("inf")),
    "capacity": (0, MAX_CPUS + 1),
    "max_replicas": (MAX_REPLICAS + 1,),
    "cfg_speedup": (MAX_SPEEDUP * 2, float("nan"), -1.0),
}


def _as_rng(rng: np.random.Generator | int) -> np.random.Generator:
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


def _configs(gen: np.random.Generator, cap: int, nodes: int, max_nodes: int) -> list[tuple[int, int]]:
    """A few distinct (nodes, replicas) pairs: small counts, counts near a node's capacity, huge ones."""
    pairs = set()
    for _ in range(int(gen.integers(1, 5))):
        a = int(gen.integers(1, min(nodes, max_nodes, 3) + 1))
        kind = gen.integers(3)
        if kind == 0:
            r = int(gen.integers(a, a + 4))
        elif kind == 1:
            r = max(a, min(a * cap, MAX_REPLICAS) - int(gen.integers(0, 2)))
        else:
            r = int(gen.integers(a, MAX_REPLICAS + 1))
        pairs.add((a, r))
    return sorted(pairs)


def extreme_fields(rng: np.random.Generator | int) -> dict:
    """Keyword fields of a small (1-4 nodes, 1-6 jobs) problem with extreme values.

    With probability ``OUT_OF_DOMAIN_FRACTION`` one field gets a value from
    ``OUT_OF_DOMAIN`` (so ``Problem(**fields)`` must raise ``InvalidProblem``).
    The current placement is empty except for at most one running job.
    """
    gen = _as_rng(rng)
    n, j = int(gen.integers(1, 5)), int(gen.integers(1, 7))
    cap0 = int(gen.choice(EXTREME_CPUS))
    capacity = np.clip(cap0 - gen.integers(0, 2, size=n), 1, MAX_CPUS)
    max_nodes = int(gen.choice([1, 2, 3, 10**9]))
    jobs, nodes, reps, speed = [], [], [], []
    max_rep = np.zeros(j, dtype=np.int64)
    for job in range(j):
        scale = float(gen.choice(EXTREME_SPEEDUP_SCALES))
        alpha, beta = gen.uniform(*ALPHA_RANGE), gen.uniform(*BETA_RANGE)
        for a, r in _configs(gen, int(capacity.max()), n, max_nodes):
            jobs.append(job)
            nodes.append(a)
            reps.append(r)
            speed.append(min(float(speedup_model(a, r, alpha, beta)) * scale, MAX_SPEEDUP))
        max_rep[job] = max(r for job_, r in zip(jobs, reps) if job_ == job)
    max_rep = np.where(gen.random(j) < 0.5, max_rep, MAX_REPLICAS)
    current = np.zeros((j, n), dtype=np.int64)
    first = np.flatnonzero(np.array(jobs) == 0)[0]
    if gen.random() < 0.5 and nodes[first] == 1 and reps[first] <= capacity[0]:
        current[0, 0] = reps[first]
    fields = dict(
        capacity=capacity,
        cfg_job=np.array(jobs),
        cfg_nodes=np.array(nodes),
        cfg_replicas=np.array(reps),
        cfg_speedup=np.array(speed),
        current=current,
        restart_factor=gen.choice([0.0, 0.5, 1.0], size=j),
        weight=gen.choice(EXTREME_WEIGHTS, size=j),
        min_replicas=np.zeros(j, dtype=np.int64),
        max_replicas=max_rep,
        p=float(gen.choice(EXTREME_P)),
        max_nodes_per_job=max_nodes,
        interference_avoidance=bool(gen.random() < 0.5),
    )
    if gen.random() < OUT_OF_DOMAIN_FRACTION:
        name = str(gen.choice(sorted(OUT_OF_DOMAIN)))
        bad = gen.choice(OUT_OF_DOMAIN[name])
        if name == "p":
            fields["p"] = float(bad)
        else:
            value = np.array(fields[name], dtype=object)
            value[int(gen.integers(value.size))] = bad
            fields[name] = value.tolist()
    return fields


def large_problem(
    rng: np.random.Generator | int,
    num_nodes: int = 64,
    cpus_per_node: int = 4,
    num_jobs: int = 200_000,
    *,
    max_replicas: int = 8,
    max_nodes_per_job: int = 4,
    running_fraction: float = 0.5,
    p: float = -1.0,
) -> Problem:
    """A random problem with many jobs, built with numpy only.

    Every job lists every pair ``(a, r)`` with ``a <= max_nodes_per_job``
    nodes and ``a <= r <= min(max_replicas, a * cpus_per_node)`` replicas,
    with :func:`~solvers.testing.speedup_model` speedups (per-job alpha and
    beta); a ``running_fraction`` of the jobs (as many as there are CPUs)
    hold one replica each, spread round-robin over the nodes.
    """
    gen = _as_rng(rng)
    pairs = [(a, r) for a in range(1, max_nodes_per_job + 1) for r in range(a, min(max_replicas, a * cpus_per_node) + 1)]
    a, r = (np.array(v, dtype=np.int64) for v in zip(*pairs))
    alpha, beta = gen.uniform(*ALPHA_RANGE, size=num_jobs), gen.uniform(*BETA_RANGE, size=num_jobs)
    job = np.repeat(np.arange(num_jobs), a.size)
    nodes, reps = np.tile(a, num_jobs), np.tile(r, num_jobs)
    current = np.zeros((num_jobs, num_nodes), dtype=np.int64)
    running = np.flatnonzero(gen.random(num_jobs) < running_fraction)[: num_nodes * cpus_per_node]
    current[running, np.arange(running.size) % num_nodes] = 1
    return Problem(
        capacity=np.full(num_nodes, cpus_per_node),
        cfg_job=job,
        cfg_nodes=nodes,
        cfg_replicas=reps,
        cfg_speedup=speedup_model(nodes, reps, alpha[job], beta[job]),
        current=current,
        restart_factor=gen.uniform(0.5, 1.0, size=num_jobs),
        weight=np.ones(num_jobs),
        min_replicas=np.zeros(num_jobs, dtype=np.int64),
        max_replicas=np.full(num_jobs, max_replicas),
        p=p,
        max_nodes_per_job=max_nodes_per_job,
    )
