"""``allocate()``: turn jobs and cluster into a :class:`solvers.Problem` (:func:`to_problem`), solve, decode."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Sequence

import numpy as np

import solvers
from solvers import InvalidProblem, OutOfTime, Problem, Status

from pollux_opt.model.allocation import Allocation
from pollux_opt.model.batch import BatchConfig
from pollux_opt.model.cluster import Cluster
from pollux_opt.model.domains import shown
from pollux_opt.model.goodput import GoodputModel, SearchCache
from pollux_opt.model.job import Job, restart_factor
from pollux_opt.model.configs import (
    batch_config,
    candidate_pairs,
    job_configs,
    model_configs,
    placeable_table,
    resolve_shapes,
    table_configs,
    top_sums,
    type_model,
    type_tops,
)
from pollux_opt.model.options import Options
from pollux_opt.model.typed import TypedGoodput, TypedTable
from pollux_opt.model.validate import check_deadline

__all__ = ["allocate", "placement_of", "solve", "to_problem"]

log = logging.getLogger(__name__)

#: Seconds per job of decoding a solver's answer (placements and batch
#: configurations): 1.3 s for 200,000 jobs on the project's 2-core machine at
#: load 1, doubled.  Kept back from the solver's time limit.
DECODE_SECONDS_PER_JOB = 1.3e-5
#: Key of a :func:`solve` answer's ``stats`` set when encoding took the whole
#: time limit (no solver ran; :func:`allocate` then skips the batch decode too).
UNENCODED = "unencoded"
#: Options passed to a solver only when its signature accepts them.
_GENERIC_SOLVER_OPTIONS = ("time_limit", "mip_gap", "seed")


def _joined(parts: list[np.ndarray], dtype) -> np.ndarray:
    """The arrays of ``parts`` end to end, as a new ``dtype`` array."""
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype=dtype)


def _restart_delay(job: Job, options: Options) -> float:
    """The delta of ``job``'s restart factor: its own delay, else the options' one."""
    return options.restart_delay if job.restart_delay is None else job.restart_delay


def _current_shape(job: Job, node_type: Mapping[str, str]) -> tuple[str, int, int] | None:
    """The job's current (type, nodes, replicas); None when it holds nothing or spans types."""
    on = {nid: k for nid, k in job.placement.items() if k > 0}
    held = {node_type[nid] for nid in on}
    return (held.pop(), len(on), sum(on.values())) if len(held) == 1 else None


def _configs_of(job: Job, tops, typed: bool, options: Options, cache: SearchCache | None,
                sia: bool, current: tuple[str, int, int] | None) -> list:
    """``[(type index, (nodes, replicas, speedups)), ...]`` of one job on the cluster's
    ``tops`` (:func:`~pollux_opt.model.configs.type_tops`; several only if ``typed``);
    ``sia`` and ``current``: as in :func:`~pollux_opt.model.configs.job_configs`."""
    if typed or isinstance(job.speedup, (TypedGoodput, TypedTable)):
        return job_configs(job, tops, options, cache, sia=sia, current=current)
    top = tops[0][1]
    if isinstance(job.speedup, GoodputModel):
        held = current[1:] if current is not None else None
        pairs = candidate_pairs(job, top, options.max_nodes_per_job, sia=sia, held=held)
        return [(0, model_configs(job.speedup, pairs, job.base, job.fixed_batch_size,
                                  options.spread_penalty, cache))]
    return [(0, table_configs(placeable_table(job, top, options.max_nodes_per_job)))]


def to_problem(cluster: Cluster, jobs: Sequence[Job], options: Options, *, deadline: float | None = None,
               cache: SearchCache | None = None) -> Problem:
    """The array problem (see :class:`solvers.Problem`) of the cluster, jobs and options.

    ``deadline`` (``time.monotonic()`` seconds, optional) bounds the encoding.
    On a cluster of several node types each job's configurations are listed
    type by type (``cfg_type``; ``node_type`` gives each node's type, in the
    order of ``cluster.types``); a one-type cluster gives the untyped problem.
    ``options.shapes`` chooses the goodput-model jobs' shapes
    (:mod:`pollux_opt.model.configs`; by default Sia's configurations on a
    cluster of several types).
    ``cache`` (optional) keeps the goodput models' batch searches across
    calls (:class:`~pollux_opt.model.goodput.SearchCache`; the same problem
    with or without it).

    Raises:
        InvalidProblem: duplicate job ids, a placement on an unknown node or over capacity.
        OutOfTime: (an :class:`InvalidProblem`) ``deadline`` passed.
    """
    node_index = {nid: i for i, nid in enumerate(cluster.node_ids)}
    caps = np.array([n.cpus for n in cluster.nodes], dtype=np.int64)
    top = top_sums(cluster)
    tops = type_tops(cluster) if cluster.typed else None
    all_tops = tops or ((cluster.types[0], top),)
    sia_shapes = resolve_shapes(options.shapes, cluster.typed) == "sia"
    node_type = {n.id: n.type for n in cluster.nodes} if sia_shapes else {}
    seen: set[str] = set()
    current = np.zeros((len(jobs), caps.size), dtype=np.int64)
    cfg_job: list[np.ndarray] = []
    cfg_type: list[np.ndarray] = []
    cfg_nodes: list[np.ndarray] = []
    cfg_reps: list[np.ndarray] = []
    cfg_spd: list[np.ndarray] = []
    for j, job in enumerate(jobs):
        check_deadline(deadline, j, len(jobs), "encoding")
        if job.id in seen:
            raise InvalidProblem(f"duplicate job id {job.id!r}")
        seen.add(job.id)
        for nid, k in job.placement.items():
            if nid not in node_index:
                raise InvalidProblem(f"job {job.id!r}: placement on unknown node {nid!r}")
            current[j, node_index[nid]] = k
        sia = sia_shapes and isinstance(job.speedup, (GoodputModel, TypedGoodput))
        shape = _current_shape(job, node_type) if sia else None
        by_type = _configs_of(job, all_tops, tops is not None, options, cache, sia, shape)
        if sia and not any(c[0].size for _, c in by_type):
            # A replica range that holds none of Sia's counts (e.g. exactly 3): every shape.
            log.debug("job %s: no Sia configuration in its replica range; every shape is offered", job.id)
            by_type = _configs_of(job, all_tops, tops is not None, options, cache, False, None)
        for t, configs in by_type:
            cfg_job.append(np.full(configs[0].size, j, dtype=np.int64))
            cfg_type.append(np.full(configs[0].size, t, dtype=np.int64))
            cfg_nodes.append(configs[0])
            cfg_reps.append(configs[1])
            cfg_spd.append(configs[2])
    load = current.sum(axis=0)
    for i in np.flatnonzero(load > caps):
        raise InvalidProblem(
            f"placement over capacity on node {cluster.nodes[i].id!r}: {load[i]} replicas > {caps[i]} cpus"
        )
    typed = {}
    if tops is not None:
        type_index = {t: i for i, t in enumerate(cluster.types)}
        typed = {"node_type": np.array([type_index[n.type] for n in cluster.nodes], dtype=np.int64),
                 "cfg_type": _joined(cfg_type, np.int64)}
    return Problem(
        **typed,
        capacity=caps,
        cfg_job=_joined(cfg_job, np.int64),
        cfg_nodes=_joined(cfg_nodes, np.int64),
        cfg_replicas=_joined(cfg_reps, np.int64),
        cfg_speedup=_joined(cfg_spd, np.float64),
        current=current,
        restart_factor=np.array([restart_factor(j.age, j.restarts, _restart_delay(j, options)) for j in jobs]),
        weight=np.array([j.weight for j in jobs], dtype=np.float64),
        min_replicas=np.array([j.min_replicas for j in jobs], dtype=np.int64),
        max_replicas=np.array([j.max_replicas for j in jobs], dtype=np.int64),
        p=options.p,
        max_nodes_per_job=options.max_nodes_per_job,
        interference_avoidance=options.interference_avoidance,
    )


def _batch_configs(
    jobs: Sequence[Job], placement: np.ndarray, cluster: Cluster, options: Options,
    cache: SearchCache | None = None,
) -> dict[str, BatchConfig]:
    top = top_sums(cluster)
    tops = dict(type_tops(cluster)) if cluster.typed else {cluster.types[0]: top}
    sia = resolve_shapes(options.shapes, cluster.typed) == "sia"
    node_type = {n.id: n.type for n in cluster.nodes} if sia else {}
    out = {}
    for job, row in zip(jobs, placement):
        k = int(row.sum())
        if k == 0:
            continue
        type_name = cluster.nodes[int(np.flatnonzero(row)[0])].type
        model, base = type_model(job, type_name)
        if model is None:
            continue
        pair = (int((row > 0).sum()), k)
        shape = _current_shape(job, node_type) if sia else None
        held = shape[1:] if shape is not None and shape[0] == type_name else None
        pairs = candidate_pairs(job, tops[type_name], options.max_nodes_per_job, model, sia=sia, held=held)
        cached = batch_config(model, pairs, base, job.fixed_batch_size, pair, cache)
        if cached is not None:  # computed by to_problem (same model, pairs and base)
            out[job.id] = cached
            continue
        choice = model.optimize(int((row > 0).sum()), k, fixed_batch_size=job.fixed_batch_size)
        out[job.id] = choice.config()
    return out


def _checked_arguments(
    cluster: Any, jobs: Any, options: Any, overrides: dict[str, Any]
) -> tuple[Options, list[Job]]:
    """The options and the list of jobs of :func:`allocate`'s arguments, or :class:`InvalidProblem`."""
    if not isinstance(cluster, Cluster):
        raise InvalidProblem(f"cluster must be a Cluster, got {shown(cluster)}")
    if options is not None and not isinstance(options, Options):
        raise InvalidProblem(
            f"options must be an Options or None (pass single options as keywords, e.g. p=0), got {shown(options)}"
        )
    opts = Options.from_mapping(overrides, base=options)
    if isinstance(jobs, (str, bytes, Mapping, Job)) or not isinstance(jobs, Iterable):
        raise InvalidProblem(f"jobs must be a sequence of Job objects, got {shown(jobs)}")
    jobs = list(jobs)
    for i, job in enumerate(jobs):
        if not isinstance(job, Job):
            raise InvalidProblem(f"jobs[{i}] must be a Job, got {shown(job)}")
    return opts, jobs


def _unsolved(cluster: Cluster, jobs: Sequence[Job], options: Options, seconds: float) -> solvers.Result:
    """The answer of a call that ran out of time before solving: every job as placed now."""
    nan = float("nan")
    column = {nid: n for n, nid in enumerate(cluster.node_ids)}
    placement = np.zeros((len(jobs), len(column)), dtype=np.int64)
    for j, job in enumerate(jobs):
        for nid, k in job.placement.items():
            if nid in column:  # encoding may stop before it rejects a node the cluster lacks
                placement[j, column[nid]] = k
    return solvers.Result(placement, Status.TIME_LIMIT_NO_SOLUTION, nan, nan, nan, seconds, 0.0, options.solver,
                          message="encoding took the whole time limit", stats={UNENCODED: True})


def placement_of(cluster: Cluster, jobs: Sequence[Job], placement: np.ndarray) -> dict[str, dict[str, int]]:
    """Job id -> {node id: replicas} of a solver's int64[J, N] ``placement`` (rows in ``jobs``' order;
    jobs given nothing map to {})."""
    ids = cluster.node_ids
    return {job.id: {ids[n]: int(row[n]) for n in np.flatnonzero(row)} for job, row in zip(jobs, placement)}


def solve(cluster: Cluster, jobs: Sequence[Job], options: Options, *,
          cache: SearchCache | None = None, refine: Callable[[Problem], Problem] | None = None) -> solvers.Result:
    """The solver's answer for checked arguments (see :func:`allocate`): encode, solve.

    ``refine`` (optional) changes the encoded problem before it is solved, e.g. a
    policy's constraint on a job's configurations; it keeps the jobs and nodes
    (their order too), so the answer decodes as the encoded problem's would.

    ``options.time_limit`` bounds the whole call; an encoding that takes it all
    returns every job's current placement with status ``time_limit_no_solution``.
    Rows of the answer's placement are in ``jobs``' order.
    """
    start = time.monotonic()
    if options.solver not in solvers.SOLVERS:
        raise InvalidProblem(f"unknown solver {options.solver!r}; choose one of {sorted(solvers.SOLVERS)}")
    deadline = None if options.time_limit is None or math.isinf(options.time_limit) else start + options.time_limit
    log.info("allocate: encoding %d jobs on %d nodes", len(jobs), len(cluster.nodes))
    try:
        problem = to_problem(cluster, jobs, options, deadline=deadline, cache=cache)
        if refine is not None:
            problem = refine(problem)
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise OutOfTime(f"encoding took the whole time limit of {options.time_limit:g} s")
    except OutOfTime as exc:
        log.warning("allocate: %s; every job keeps its current placement (%s)",
                    exc, Status.TIME_LIMIT_NO_SOLUTION.value)
        return _unsolved(cluster, jobs, options, time.monotonic() - start)
    accepted = solvers.solver_options(options.solver)
    kwargs = {
        k: getattr(options, k)
        for k in _GENERIC_SOLVER_OPTIONS
        if k in accepted and getattr(options, k) is not None
    }
    if "time_limit" in kwargs and left is not None:
        # The limit covers the whole call: encoding before the solve, decoding after it.
        kwargs["time_limit"] = left - min(DECODE_SECONDS_PER_JOB * len(jobs), left / 2)
    log.info("allocate: solving %d configurations with %s%s", problem.cfg_job.size, options.solver,
             "" if left is None else f" ({left:.3g} s of the time limit left)")
    result = solvers.solve(problem, options.solver, **kwargs)
    log.info(
        "allocate: %d jobs on %d nodes with %s -> %s, objective %.6g (build %.3fs, solve %.3fs)",
        len(jobs), len(cluster.nodes), options.solver, result.status.value,
        result.objective, result.build_seconds, result.solve_seconds,
    )
    return result


def allocate(
    cluster: Cluster,
    jobs: Sequence[Job],
    options: Options | None = None,
    *,
    cache: SearchCache | None = None,
    **overrides: Any,
) -> Allocation:
    """Allocate replicas to jobs, maximising the pinned power-mean objective.

    Args:
        cluster: the nodes and their capacities.
        jobs: the jobs (ids unique).
        options: allocation options (defaults: p=-1, restart delay 30 s,
            interference avoidance, 16 nodes per job, exact "milp" solver).
        cache: optional :class:`~pollux_opt.model.goodput.SearchCache` that a
            caller allocating every round keeps, so that goodput models with
            unchanged throughput parameters repeat less of their batch
            search (the same answer with or without it).
        **overrides: any :class:`Options` field by name, e.g. ``solver="greedy"``.

    Returns:
        An :class:`Allocation`; infeasibility and time limits are statuses, not errors.
        ``time_limit`` bounds the whole call: the solver gets what encoding
        left, and an encoding that takes it all returns every job's current
        placement with status ``time_limit_no_solution`` (objective nan).

    Raises:
        InvalidProblem: bad input, naming the field and its value.

    Example::

        >>> from pollux_opt import Cluster, Job, allocate
        >>> cluster = Cluster.uniform(2, 4)
        >>> job = Job("a", {(1, 1): 1.0, (1, 2): 1.8, (2, 2): 1.6}, max_replicas=2)
        >>> alloc = allocate(cluster, [job])
        >>> alloc.status.value, sum(alloc.placement["a"].values())
        ('optimal', 2)
    """
    opts, jobs = _checked_arguments(cluster, jobs, options, overrides)
    if cache is not None and not isinstance(cache, SearchCache):
        raise InvalidProblem(f"cache must be a SearchCache or None, got {shown(cache)}")
    result = solve(cluster, jobs, opts, cache=cache)
    return Allocation(
        placement=placement_of(cluster, jobs, result.placement),
        batch=_batch_configs(jobs, result.placement, cluster, opts, cache)
        if not result.stats.get(UNENCODED) else {},
        objective=result.objective,
        bound=result.bound,
        gap=result.gap,
        status=result.status,
        build_seconds=result.build_seconds,
        solve_seconds=result.solve_seconds,
        solver=result.solver,
    )
