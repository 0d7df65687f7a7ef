"""Greedy solver: Optimus-style marginal gain, a fast baseline and a sanity floor.

Optimus (Peng et al., EuroSys 2018) allocates resources one unit at a time to
the job whose estimated gain is largest.  Here the gain of a job is the change
of its term ``w_j u(x_j)`` of the pinned objective (``u`` on the problem's
:class:`solvers.UtilityScale`: :func:`solvers.utility` itself on ordinary
instances; monotone in the power mean), so each step is the greedy step on
the objective itself:

* each job's *candidates* are its allowed (nodes, replicas) pairs with more
  replicas than it holds now that fit the free capacity left by the other jobs
  (one node with enough free CPUs; or, for ``a >= 2`` nodes, the ``a``
  eligible nodes -- free, and without another multi-node job under interference
  avoidance -- with the most free CPUs hold enough);
* a candidate's value pays the job's restart factor if it is running, except
  the candidate "exactly its current placement" when that still fits;
* on a cluster with node types each candidate is a (type, nodes, replicas)
  triple and uses nodes of its type only (a job never spans two types);
* the job and candidate with the largest gain *per added CPU* win (ties: fewest
  replicas, then fewest nodes); the job is re-placed (best-fit node for one
  node, the freest eligible nodes otherwise); repeat until no candidate gains.

Gains are kept in a lazy priority queue: a popped entry computed before the last
change is recomputed and pushed back unless it still beats the next entry; when
the queue empties, every job is recomputed once more before stopping, so the
answer is a fixed point where no single step gains.  The time limit is checked
before every step and every ``CLOCK_EVERY`` jobs while candidates are computed.

The greedy runs twice -- from nothing, and from the jobs' current placements
that are allowed and jointly feasible -- and returns the better answer, never
worse than keeping the current placement when that is feasible.
"""

from __future__ import annotations

import heapq
import math
import time

import numpy as np

from .checks import check_problem, check_time_limit
from .objective import EPS, UtilityScale
from .packer import best_fit, roomiest, spread
from .placement import evaluate, violations
from .problem import Problem
from .result import Result, Status

__all__ = ["solve_greedy"]

#: A step must raise the objective's utility sum by more than this (absolute),
#: so that float round-off cannot make the greedy cycle or add useless CPUs.
GAIN_TOLERANCE = 1e-12

#: Jobs between two looks at the clock while candidates are computed job by
#: job (each costs some tens of microseconds, so the time limit is overrun by
#: milliseconds at most).
CLOCK_EVERY = 256


def _scale(problem: Problem, current_speedup: np.ndarray) -> tuple[UtilityScale, np.ndarray]:
    """The utility scale (:class:`~solvers.objective.UtilityScale`) and its weights float64[J].

    Plain ``u`` and weights on ordinary instances; the Box-Cox form where the
    plain one's gains would vanish (tiny |p|, speedups far from 1).
    """
    f = np.where(problem.has_current, problem.restart_factor, 1.0)
    best = np.full(problem.num_jobs, -np.inf)  # each job's best y over pairs that fit the cluster
    fits = problem.fits_cluster(problem.cfg_replicas, problem.cfg_nodes, problem.cfg_type if problem.typed else None)
    job = problem.cfg_job[fits]
    np.maximum.at(best, job, problem.cfg_speedup[fits] * f[job] + EPS)
    best = np.fmax(best, current_speedup + EPS)
    scale = UtilityScale.of(problem.p, best, problem.weight)
    weight = problem.weight if scale.weight_scale == 1 else problem.weight * scale.weight_scale
    return scale, weight


class _Greedy:
    """Mutable working state of one greedy run (private; one instance per run)."""

    def __init__(self, problem: Problem, deadline: float, shared: "_Shared") -> None:
        self.problem = problem
        self.deadline = deadline
        j, n = problem.num_jobs, problem.num_nodes
        self.x = np.zeros((j, n), dtype=np.int64)
        self.free = problem.capacity.copy()
        self.multi = np.zeros(n, dtype=np.int64)  # multi-node jobs on each node
        self.steps = 0
        self.timed_out = False
        self.shared = shared
        self.cur_nodes, self.cur_reps = shared.cur_nodes, shared.cur_reps
        # w_j u(x_j) of each job's row (all empty now).
        self.term = shared.weight * np.full(j, float(shared.scale(0.0)))

    def cfgs(self, j: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(nodes, replicas, speedup) of job j's allowed pairs, ordered by (replicas, nodes)."""
        sl = slice(self.shared.start[j], self.shared.start[j + 1])
        return self.shared.nodes[sl], self.shared.reps[sl], self.shared.speedup[sl]

    # ------------------------------------------------------------------ values
    def _term(self, j: int, value: float) -> float:
        return float(self.shared.weight[j] * self.shared.scale(value))

    def _value(self, j: int, row: np.ndarray) -> float:
        """x_j of job j placed as ``row`` (0 if empty; row must be allowed)."""
        reps = int(row.sum())
        if reps == 0:
            return 0.0
        a, r, s = self.cfgs(j)
        match = (a == int((row > 0).sum())) & (r == reps)
        if self.shared.typed:
            match &= self.shared.types[self.shared.start[j] : self.shared.start[j + 1]] == self._row_type(row)
        s = float(s[np.flatnonzero(match)[0]])
        moved = self.problem.has_current[j] and np.any(row != self.problem.current[j])
        return s * (self.problem.restart_factor[j] if moved else 1.0)

    def _row_type(self, row: np.ndarray) -> int:
        """Node type of a non-empty row (its nodes share one type)."""
        return int(self.problem.node_type[int(np.flatnonzero(row)[0])])

    # --------------------------------------------------------------- placement
    def set_row(self, j: int, row: np.ndarray) -> None:
        old = self.x[j]
        if (old > 0).sum() > 1:
            self.multi[old > 0] -= 1
        self.free += old
        self.x[j] = row
        self.free -= row
        if (row > 0).sum() > 1:
            self.multi[row > 0] += 1
        self.term[j] = self._term(j, self._value(j, row))

    def candidate(self, j: int) -> tuple[float, np.ndarray] | None:
        """(gain per added CPU, new row) of job j's best step, or None if none gains."""
        p = self.problem
        a, r, s = self.cfgs(j)
        held = int(self.x[j].sum())
        more = r > held
        if not more.any():
            return None
        a, r, s = a[more], r[more], s[more]
        own = self.x[j] > 0
        free = self.free + self.x[j]
        multi = self.multi - (own if own.sum() > 1 else 0)
        eligible = free > 0
        if p.interference_avoidance:
            eligible &= multi == 0
        if self.shared.typed:
            t = self.shared.types[self.shared.start[j] : self.shared.start[j + 1]][more]
            fits = self._typed_fits(a, r, t, free, eligible)
        else:
            top = np.sort(free[eligible])[::-1]
            reach = np.concatenate([[0], np.cumsum(top)])
            spread_fits = (a <= top.size) & (r <= reach[np.minimum(a, top.size)])
            fits = np.where(a == 1, r <= free.max(initial=0), spread_fits)
        value = s * (p.restart_factor[j] if p.has_current[j] else 1.0)
        keep = self._current_fits(j, free, multi)
        if keep:
            same = (a == self.cur_nodes[j]) & (r == self.cur_reps[j])
            if self.shared.typed:
                same &= t == self.shared.cur_type[j]
            at = np.flatnonzero(same)
            if at.size:
                value = value.copy()
                value[at] = s[at]
                fits = fits.copy()
                fits[at] = True
        if not fits.any():
            return None
        terms = self.shared.weight[j] * self.shared.scale(value)
        gain = np.where(fits, (terms - self.term[j]) / (r - held), -np.inf)
        best = int(np.argmax(gain))
        if not gain[best] * (r[best] - held) > GAIN_TOLERANCE:
            return None
        if keep and a[best] == self.cur_nodes[j] and r[best] == self.cur_reps[j]:
            if not self.shared.typed or t[best] == self.shared.cur_type[j]:
                return float(gain[best]), p.current[j].copy()
        if self.shared.typed:
            return float(gain[best]), self._place(int(a[best]), int(r[best]), free, eligible, int(t[best]))
        return float(gain[best]), self._place(int(a[best]), int(r[best]), free, eligible)

    def _typed_fits(self, a, r, t, free: np.ndarray, eligible: np.ndarray) -> np.ndarray:
        """bool[...]: candidates (nodes a, replicas r, type t) that fit the free nodes of their type."""
        fits = np.zeros(a.shape, dtype=bool)
        for kind, mine in enumerate(self.shared.type_nodes):
            at = t == kind
            if not at.any():
                continue
            top = np.sort(free[eligible & mine])[::-1]
            reach = np.concatenate([[0], np.cumsum(top)])
            aa, rr = a[at], r[at]
            spread_fits = (aa <= top.size) & (rr <= reach[np.minimum(aa, top.size)])
            fits[at] = np.where(aa == 1, rr <= free[mine].max(initial=0), spread_fits)
        return fits

    def _current_fits(self, j: int, free: np.ndarray, multi: np.ndarray) -> bool:
        """Whether job j could go back to exactly its current placement now."""
        p = self.problem
        if not p.has_current[j]:
            return False
        row = p.current[j]
        if np.any(row > free):
            return False
        if self.cur_nodes[j] > 1 and p.interference_avoidance and np.any(multi[row > 0] > 0):
            return False
        return bool(not np.isnan(self.shared.cur_speedup[j]))

    def _place(self, a: int, r: int, free: np.ndarray, eligible: np.ndarray, kind: int | None = None) -> np.ndarray:
        """A row with r replicas on a nodes (of type ``kind``) as :mod:`solvers.packer` places them."""
        row = np.zeros_like(free)
        mine = None if kind is None else self.shared.type_nodes[kind]
        if a == 1:
            row[best_fit(free, r, mine)] = r
            return row
        nodes = roomiest(free, eligible if mine is None else eligible & mine)[:a]
        row[nodes] = spread(free[nodes], r)
        return row

    # -------------------------------------------------------------------- loop
    def _late(self) -> bool:
        """True (and marks the run timed out) once the deadline has passed."""
        if time.perf_counter() >= self.deadline:
            self.timed_out = True
        return self.timed_out

    def run(self) -> None:
        """Lazy-greedy loop (module docstring) until no step gains or time runs out."""
        version = 0
        while True:
            heap: list[tuple[float, int, int, np.ndarray]] = []
            for j in range(self.problem.num_jobs):
                if j % CLOCK_EVERY == 0 and self._late():
                    return
                cand = self.candidate(j)
                if cand is not None:
                    heap.append((-cand[0], j, version, cand[1]))
            heapq.heapify(heap)
            if not heap:
                return
            while heap:
                if self._late():
                    return
                neg_gain, j, seen, row = heapq.heappop(heap)
                if seen != version:
                    cand = self.candidate(j)
                    if cand is None:
                        continue
                    if heap and -cand[0] > heap[0][0]:
                        heapq.heappush(heap, (-cand[0], j, version, cand[1]))
                        continue
                    row = cand[1]
                self.set_row(j, row)
                self.steps += 1
                version += 1
                cand = self.candidate(j)
                if cand is not None:
                    heapq.heappush(heap, (-cand[0], j, version, cand[1]))


def _pair_order(problem: Problem) -> np.ndarray:
    """``np.lexsort((cfg_nodes, cfg_replicas, cfg_job))``, by one argsort of a combined key when it fits int64."""
    a, r = problem.table_shape
    if problem.typed:  # ties between types: lower type first
        return np.lexsort((problem.cfg_type, problem.cfg_nodes, problem.cfg_replicas, problem.cfg_job))
    if problem.num_jobs * (r + 1) * (a + 1) >= 2**62:
        return np.lexsort((problem.cfg_nodes, problem.cfg_replicas, problem.cfg_job))
    key = (problem.cfg_job * (r + 1) + problem.cfg_replicas) * (a + 1) + problem.cfg_nodes
    return np.argsort(key, kind="stable")


class _Shared:
    """What both greedy runs read: the pairs sorted per job, the current shapes, the utility scale."""

    def __init__(self, problem: Problem) -> None:
        # Pairs ordered by (job, replicas, nodes): per job the tie rule's order
        # (a stable sort, so as sorting each job's slice alone).
        order = _pair_order(problem)
        self.nodes = problem.cfg_nodes[order]
        self.reps = problem.cfg_replicas[order]
        self.speedup = problem.cfg_speedup[order]
        self.typed = problem.typed
        self.types = problem.cfg_type[order]
        self.type_nodes = [problem.node_type == t for t in range(problem.num_types)]  # bool[N] per type
        self.start = problem.cfg_start
        cur = problem.current
        self.cur_nodes = (cur > 0).sum(axis=1)
        self.cur_reps = cur.sum(axis=1)
        # Speedup of each job's current shape (nan if it holds nothing, the shape is not
        # allowed, or it spans several node types).
        jobs = np.arange(problem.num_jobs)
        if self.typed:
            self.cur_type, mixed = problem.placement_types(cur)
            self.cur_speedup = problem.lookup_speedup(jobs, self.cur_nodes, self.cur_reps, self.cur_type)
            self.cur_speedup[mixed] = np.nan
        else:
            self.cur_speedup = problem.lookup_speedup(jobs, self.cur_nodes, self.cur_reps)
        self.scale, self.weight = _scale(problem, np.where(problem.has_current, self.cur_speedup, np.nan))


def _kept_current(problem: Problem, shared: _Shared) -> np.ndarray:
    """The current placement restricted to jobs whose rows are allowed and jointly feasible.

    Jobs are kept in index order; a multi-node job that would share a node with
    an earlier-kept multi-node job (under interference avoidance) is dropped.
    """
    x = np.zeros_like(problem.current)
    taken = np.zeros(problem.num_nodes, dtype=bool)
    for j in np.flatnonzero(problem.has_current & ~np.isnan(shared.cur_speedup)):
        row = problem.current[j]
        nodes = int(shared.cur_nodes[j])
        if nodes > 1 and problem.interference_avoidance:
            if np.any(taken[row > 0]):
                continue
            taken[row > 0] = True
        x[j] = row
    return x


def solve_greedy(problem: Problem, *, time_limit: float | None = None) -> Result:
    """Optimus-style marginal-gain greedy (module docstring).

    Args:
        problem: the allocation problem.
        time_limit: wall seconds for the whole call; when it runs out the best
            placement so far (feasible after every step) is returned with
            status ``TIME_LIMIT``.

    Returns:
        A :class:`Result` with status ``FEASIBLE`` (or ``TIME_LIMIT``), the
        objective recomputed by :func:`solvers.evaluate`, ``bound = gap = nan``,
        ``build_seconds`` 0 (nothing to build) and ``stats`` with ``steps``
        (CPUs handed out, over both runs) and ``start`` ("empty" or "current").

    Raises:
        InvalidProblem: for a bad problem or option.
    """
    start = time.perf_counter()
    check_problem(problem)
    check_time_limit(time_limit)
    deadline = math.inf if time_limit is None else start + float(time_limit)

    answers: list[tuple[str, np.ndarray]] = []
    if not violations(problem, problem.current):
        answers.append(("keep", problem.current.copy()))
    shared = _Shared(problem)
    steps, timed_out = 0, False
    for name, seed in (("current", _kept_current(problem, shared)), ("empty", None)):
        run = _Greedy(problem, deadline, shared)
        if seed is not None:
            for j in np.flatnonzero(seed.sum(axis=1)):
                run.set_row(int(j), seed[j])
        run.run()
        steps += run.steps
        answers.append((name, run.x.copy()))
        if run.timed_out:
            timed_out = True
            break
    objectives = [evaluate(problem, x) for _, x in answers]
    best = int(np.argmax(objectives))
    name, placement = answers[best]
    return Result(
        placement=placement,
        status=Status.TIME_LIMIT if timed_out else Status.FEASIBLE,
        objective=float(objectives[best]),
        bound=float("nan"),
        gap=float("nan"),
        build_seconds=0.0,
        solve_seconds=time.perf_counter() - start,
        solver="greedy",
        message=f"{steps} greedy steps; best start: {name}",
        stats={"steps": steps, "start": name},
    )
