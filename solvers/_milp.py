r"""Exact MILP for the allocation problem: one option per job, nodes packed by arc flow.

The model is a Pyomo ``ConcreteModel`` (built by the pure :func:`build_model`),
compiled to arrays with Pyomo's ``LinearStandardFormCompiler`` and solved by
HiGHS through highspy.  ``docs/formulation.md`` has the full write-up with
measured figures; :mod:`solvers._milp_large` the large-cluster variant.

Idea.  Nodes that nobody keeps a job on are interchangeable, so the model does
not say *which* node gets what: it counts how many nodes take each *path* of a
small arc-flow graph (Valério de Carvalho's bin-packing formulation, one unit
of flow per node), a path listing the pieces the node hosts.  Only nodes that
hold a job which may stay in place are named, and only through their residual
capacity after the jobs kept on them.  Decoding splits the flow into one path
per node.  This removes the symmetry between nodes that made a node-indexed
model slow (a 0.3 % gap left after 15 s on 16 x 4 CPUs and 20 jobs).

Indices.  Jobs j; nodes n with capacity cap_n, C = max_n cap_n; *options* o of
job j(o), each K_o replicas on a node count in [lo_o, hi_o] with speedup s_o
(a run of the job's allowed configurations of equal K and speedup, after
:func:`prune_dominated`; see :class:`Choices`); running jobs j in KEEP whose
current shape (N0_j, K0_j) is allowed; *holding* nodes n in H, those with
cur[j, n] > 0 for some j in KEEP, each with states t = (residual r_t, slot taken l_t).

Graph.  Vertices are (layer, level v in 0..C) plus a sink.  A node with
residual r enters at level C - r, climbs one arc per piece it hosts and closes
into the sink.  With interference avoidance the layers are F (fresh: the
multi-node slot is free) and I (items only):

    multi  (F, v) -> (I, v + m)                  m replicas of some multi-node job
    item   (F, v) -> (I, v + k), (I, v) -> (I, v + k)   a single-node job of K = k
    close  (F, v) -> sink, (I, v) -> sink

so a node hosts at most one multi-node segment, none if a multi-node job stays
on it (it enters in I).  Without interference avoidance there is one layer per
multi-node job, then I: ``skip`` (j, v) -> (j+1, v) and ``segment``
(j, v) -> (j+1, v+m) of that job only, so a job's segments lie on distinct nodes.

Variables
    y[o] in {0,1}   job j(o) is (re)started in option o;
    k[j] in {0,1}   running job j keeps its placement;
    g[j,m] in Z>=0  nodes on which multi-node job j puts m replicas (with
                    interference avoidance; else its segment arcs play this role);
    h[n,t] in {0,1} holding node n is in state t;
    f[a] in Z>=0    nodes whose path uses arc a.

Constraints (one named Pyomo rule each)
    one_choice      sum_o y[o] + k[j] <= 1
    nodes_at_least  sum_m g[j,m] >= sum_o lo_o y[o]    (== when every lo_o = hi_o)
    nodes_at_most   sum_m g[j,m] <= sum_o hi_o y[o]
    multi_replicas  sum_m m g[j,m] = sum_o K_o y[o]
    segments        sum_j g[j,m] = sum_{multi arcs a of size m} f[a]
    single_items    sum_{o: hi_o = 1, K_o = k} y[o] = sum_{item arcs a of size k} f[a]
    one_state       sum_t h[n,t] = 1
    residual        sum_t r_t h[n,t] + sum_j cur[j,n] k[j] = cap_n
    slot            sum_{t: l_t} h[n,t] = sum_{j multi-node in KEEP} k[j]
    flow            out - in - sum_{t entering at v} h[n,t] = non-holding nodes entering at v

Objective.  ``M_p = (sum_j w_j (x_j + eps)^p / W)^(1/p)`` is monotone in
``U = sum_j w_j u(x_j)`` (``u`` from :func:`solvers.utility`), and each job
takes exactly one option, keep, or nothing, each of constant ``u``, so U is
linear:

    max  U = sum_j w_j u(0) + sum_o w_j (u(s_o f_j) - u(0)) y[o] + sum_j w_j (u(s0_j) - u(0)) k[j]

with f_j the restart factor (1 for a job that holds nothing), s0_j the
speedup of the current placement.  Every integer solution decodes to a feasible
placement worth at least its U, and every feasible placement encodes to a
solution of equal U, so the optimum is exact.  The objective reported is
recomputed from the placement with :func:`solvers.evaluate`.

Solve.  (1) :func:`relax` prices CPUs (and multi-node slots) in the aggregated
relaxation: a Lagrangian bound L >= optimum and a reduced cost rc_o per option,
any placement using o being worth at most L - rc_o.  (2) Round one offers only
options with rc_o <= ``FIRST_ROUND_REL`` max(|L|, W).  A placement worth more
than L - min_{o not offered} rc_o uses offered options only, so if the round's
best placement reaches that value it is optimal; otherwise round two offers
every o with rc_o <= L - (round-one value), which is then exact.  (3) Each
round solves the LP relaxation first and runs the MIP only if it is
fractional, warm-started from the current placement (round two from round
one's answer).  (4) HiGHS statuses map to :class:`solvers.Status` through
``HIGHS_STATUS``; HiGHS 1.16 sometimes returns the warm start as its primal
with the optimum's objective, which is detected and re-solved cold.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from ._checks import check_problem, check_time_limit
from ._errors import InvalidProblem
from ._problem import Problem, evaluate, job_values, mean_from_utility_sum, utility, violations
from ._result import Result, Status

__all__ = [
    "AUTO_LARGE_CPUS",
    "FORMULATIONS",
    "HIGHS_STATUS",
    "Choices",
    "Relaxation",
    "build_model",
    "choices",
    "choose_formulation",
    "prune_dominated",
    "relax",
    "solve_milp",
]

log = logging.getLogger(__name__)

#: Default relative MIP gap, as pinned by the allocation options (issue 2).
DEFAULT_MIP_GAP = 1e-4

#: Names accepted by ``solve_milp(formulation=...)``.
FORMULATIONS = ("auto", "exact", "large")

#: ``formulation="auto"`` switches to the large-cluster formulation from this
#: many CPUs (sum of node capacities) on.  Measured on this project's 2-core
#: machine with random clusters of 4-CPU nodes and one job per 2 CPUs
#: (docs/formulation.md): the exact solve took 0.1 s of CPU at 256 CPUs, 0.4 to
#: 0.8 s at 512 and 3.3 s at 1024; the large one 0.05 to 0.13 s, losing at
#: most 0.06 % of the exact optimum.
AUTO_LARGE_CPUS = 512

#: First round of the exact solve: options whose Lagrangian reduced cost is at
#: most this fraction of ``max(|L|, sum of weights)``.  Measured over the 18
#: anchor rounds and 24 random 16 x 4 clusters (docs/formulation.md): 0.3 %
#: needed a second round on 1 instance in 7 and gave the lowest median and
#: mean time of the rules tried; the second round is exact regardless.
FIRST_ROUND_REL = 3e-3

#: Relative tolerance when comparing utility sums (float noise of HiGHS and numpy).
_UTILITY_RTOL = 1e-9


def _highs_status_table() -> dict:
    """Map HiGHS model statuses to (has_solution -> Status, no_solution -> Status)."""
    import highspy

    ms = highspy.HighsModelStatus
    table = {
        ms.kOptimal: (Status.OPTIMAL, Status.ERROR),
        ms.kInfeasible: (Status.INFEASIBLE, Status.INFEASIBLE),
        ms.kUnboundedOrInfeasible: (Status.ERROR, Status.INFEASIBLE),
        ms.kTimeLimit: (Status.TIME_LIMIT, Status.TIME_LIMIT_NO_SOLUTION),
        ms.kIterationLimit: (Status.TIME_LIMIT, Status.TIME_LIMIT_NO_SOLUTION),
        ms.kInterrupt: (Status.TIME_LIMIT, Status.TIME_LIMIT_NO_SOLUTION),
    }
    if hasattr(ms, "kSolutionLimit"):
        table[ms.kSolutionLimit] = (Status.TIME_LIMIT, Status.TIME_LIMIT_NO_SOLUTION)
    return table


#: HiGHS model status -> (status when a feasible solution exists, status when not);
#: any status not listed maps to ``Status.ERROR``.  Built lazily (highspy import).
HIGHS_STATUS: dict = {}


def prune_dominated(problem: Problem, usable: np.ndarray | None = None) -> np.ndarray:
    """bool[C]: configurations that no optimal solution needs (False: prune it).

    Configuration (N, K) of a job is dominated by another of its configurations
    (N', K') with speedup ``s' >= s`` when every placement realising (N, K)
    contains a placement realising (N', K'): keep the N' nodes holding most
    replicas (together at least ``ceil(K N' / N)``) and drop replicas down to
    K'.  That holds when ``N' <= N`` and ``N' <= K' <= ceil(K N' / N)``; the
    sub-placement uses no more capacity, no more nodes, and is multi-node only
    if the original was.  Ties keep the smaller shape.  Dropping dominated
    configurations keeps the optimum exact.

    Vectorised over all configurations at once with a running maximum of each
    job's speedup table along the replica axis; with ``usable`` (bool[C]) only
    usable configurations dominate others.
    """
    if problem.num_configs == 0:
        return np.ones(0, dtype=bool)
    a, r = problem.table_shape
    table = np.full((problem.num_jobs, a + 1, r + 1), -np.inf)
    src = np.ones(problem.num_configs, dtype=bool) if usable is None else np.asarray(usable, dtype=bool)
    table[problem.cfg_job[src], problem.cfg_nodes[src], problem.cfg_replicas[src]] = problem.cfg_speedup[src]
    best_upto = np.maximum.accumulate(table, axis=2)  # [j, N', K']: max speedup with <= K' replicas
    job, nodes, reps = problem.cfg_job, problem.cfg_nodes, problem.cfg_replicas
    other = np.arange(1, a + 1)[None, :]  # N'
    reach = -(-reps[:, None] * other // nodes[:, None])  # ceil(K N' / N)
    # Same N: strictly fewer replicas; fewer N: up to ceil(K N' / N).
    reach = np.where(other == nodes[:, None], reps[:, None] - 1, np.minimum(reach, r))
    rival = best_upto[job[:, None], other, reach]
    rival[other > nodes[:, None]] = -np.inf
    return ~(rival.max(axis=1) >= problem.cfg_speedup)


@dataclass(frozen=True)
class Choices:
    """Everything a job may do, with its objective coefficient (pure numpy, shapes in brackets).

    An *option* merges the configurations of one job that have the same
    replica count K, the same speedup and consecutive node counts lo..hi (all
    > 1): every such count is allowed and worth the same, so the solver picks
    the node count within [lo, hi] and the optimum is unchanged (the anchors'
    speedups depend on the node count only through "one node or several", so
    this merges up to 16 configurations into one).  Dominated configurations
    (:func:`prune_dominated`) are left out first.

    ``worth = w_j u(s f_j)`` with f_j the restart factor of a running job (1
    for one that holds nothing), ``keep_worth = w_j u(s0_j)``, ``idle_worth =
    w_j u(0)``; ``gain = worth - idle_worth`` and ``base = sum_j idle_worth``,
    so the utility sum of a choice is ``base`` plus the gains of the chosen
    options and keeps.
    """

    job: np.ndarray  # int64[O] job of each option
    reps: np.ndarray  # int64[O] replicas K
    lo: np.ndarray  # int64[O] fewest nodes
    hi: np.ndarray  # int64[O] most nodes
    speedup: np.ndarray  # float64[O]
    worth: np.ndarray  # float64[O]
    gain: np.ndarray  # float64[O]
    keep: np.ndarray  # int64[Kp] running jobs whose current shape is allowed
    keep_reps: np.ndarray  # int64[Kp] K0
    keep_nodes: np.ndarray  # int64[Kp] N0
    keep_worth: np.ndarray  # float64[Kp]
    keep_gain: np.ndarray  # float64[Kp]
    idle_worth: np.ndarray  # float64[J]
    base: float


def choices(problem: Problem) -> Choices:
    """The options and keep choices of ``problem`` (see :class:`Choices`)."""
    c = np.flatnonzero(prune_dominated(problem))
    job, reps = problem.cfg_job[c], problem.cfg_replicas[c]
    nodes, spd = problem.cfg_nodes[c], problem.cfg_speedup[c]
    multi = nodes > 1
    order = np.lexsort((nodes, spd, reps, multi, job))
    job, reps, nodes, spd, multi = job[order], reps[order], nodes[order], spd[order], multi[order]
    new_run = np.ones(c.size, dtype=bool)
    new_run[1:] = (
        (job[1:] != job[:-1])
        | (reps[1:] != reps[:-1])
        | (spd[1:] != spd[:-1])
        | ~multi[1:]
        | (nodes[1:] != nodes[:-1] + 1)
    )
    first = np.flatnonzero(new_run)
    last = np.append(first[1:], c.size)[: first.size].astype(np.int64) - 1

    cur = problem.current
    n0, k0 = (cur > 0).sum(axis=1), cur.sum(axis=1)
    a, r = problem.table_shape
    running = np.flatnonzero(problem.has_current & (n0 <= a) & (k0 <= r))
    s0 = problem.speedup_table[running, n0[running], k0[running]]
    keep, keep_speedup = running[~np.isnan(s0)], s0[~np.isnan(s0)]

    p, w = problem.p, problem.weight
    u0 = float(utility(0.0, p))
    f = np.where(problem.has_current, problem.restart_factor, 1.0)
    worth = w[job[first]] * utility(spd[first] * f[job[first]], p)
    keep_worth = w[keep] * utility(keep_speedup, p)
    return Choices(
        job=job[first],
        reps=reps[first],
        lo=nodes[first],
        hi=nodes[last],
        speedup=spd[first],
        worth=worth,
        gain=w[job[first]] * (utility(spd[first] * f[job[first]], p) - u0),
        keep=keep,
        keep_reps=k0[keep],
        keep_nodes=n0[keep],
        keep_worth=keep_worth,
        keep_gain=w[keep] * (utility(keep_speedup, p) - u0),
        idle_worth=w * u0,
        base=float(w.sum() * u0),
    )


@dataclass(frozen=True)
class Relaxation:
    """Lagrangian bound of the aggregated relaxation, and reduced costs of options.

    The relaxation keeps one choice per job but replaces the node-level
    constraints by two totals: replicas <= total capacity, and (with
    interference avoidance) nodes spanned by multi-node jobs <= number of
    nodes.  Pricing them at ``cpu_price`` (lambda) and ``slot_price`` (mu) gives,
    for any lambda, mu >= 0, the upper bound

        L = lambda CAP + mu NODES + sum_j max(w_j u(0), max_o (w_j u_o - lambda K_o - mu N_o))

    on the utility sum of every feasible placement (weak duality; N_o counts
    only for multi-node options).  An option o of job j has reduced cost
    ``rc_o = best_j - (w_j u_o - lambda K_o - mu N_o) >= 0``, and every
    placement using it is worth at most ``L - rc_o``.  Sums run over each
    job's best value, never over gains against u(0), which for p < -1 is
    huge (-1e12 at p = -4) and would cancel most digits.
    """

    bound: float  # L, an upper bound on the utility sum
    cpu_price: float  # lambda
    slot_price: float  # mu
    reduced_cost: np.ndarray  # float64[O]


#: Bisection steps per price when minimising the Lagrangian (2^-40 of the price range).
_PRICE_STEPS = 40
#: Rounds of alternating between the two prices when the slot total binds.
_PRICE_ROUNDS = 3


def relax(problem: Problem, ch: Choices) -> Relaxation:
    """Minimise the Lagrangian bound over the two prices (see :class:`Relaxation`).

    The bound is convex and piecewise linear in each price; each price is found
    by bisection on the sign of its subgradient (capacity minus the totals the
    best choices use).  Any prices give a valid bound, so stopping early is safe.
    """
    slots = problem.interference_avoidance
    cap_total, nodes_total = float(problem.capacity.sum()), float(problem.num_nodes)
    placeable = (ch.hi > 1) | (ch.reps <= problem.capacity.max(initial=0))
    jobs = np.arange(problem.num_jobs)
    # Entries: options, keeps, and one "hold nothing" per job.
    job = np.concatenate([ch.job, ch.keep, jobs])
    worth = np.concatenate([np.where(placeable, ch.worth, -np.inf), ch.keep_worth, ch.idle_worth])
    gain = worth - ch.idle_worth[job]
    reps = np.concatenate([ch.reps, ch.keep_reps, np.zeros(jobs.size)]).astype(np.float64)
    span = np.concatenate(
        [np.where(ch.hi > 1, ch.lo, 0), np.where(ch.keep_nodes > 1, ch.keep_nodes, 0), np.zeros(jobs.size)]
    )
    span = span.astype(np.float64) * slots
    order = np.argsort(job, kind="stable")
    a, g, k, n = worth[order], gain[order], reps[order], span[order]
    sorted_job = job[order]
    starts = np.flatnonzero(np.r_[True, sorted_job[1:] != sorted_job[:-1]]) if job.size else np.zeros(0, int)

    def evaluate_prices(lam: float, mu: float) -> tuple[float, float, float, np.ndarray, np.ndarray]:
        """(sum of job bests, replicas used, slots used, entry values, each entry's job best)."""
        value = a - lam * k - mu * n
        if value.size == 0:
            return 0.0, 0.0, 0.0, value, value
        best = np.maximum.reduceat(value, starts)
        best_each = np.repeat(best, np.diff(np.append(starts, value.size)))
        picked = np.flatnonzero(value >= best_each)
        group = np.searchsorted(starts, picked, side="right") - 1
        # Ties count their smallest use, so the subgradient errs towards lower prices.
        use_k = np.full(starts.size, np.inf)
        use_n = np.full(starts.size, np.inf)
        np.minimum.at(use_k, group, k[picked])
        np.minimum.at(use_n, group, n[picked])
        return float(best.sum()), float(use_k.sum()), float(use_n.sum()), value, best_each

    def lowest_price(use, limit: float, per: np.ndarray) -> float:
        """Smallest price in [0, max gain / use] at which ``use(price) <= limit`` (bisection)."""
        if use(0.0) <= limit:
            return 0.0
        ratio = g / np.maximum(per, 1.0)
        lo, hi = 0.0, float(np.max(ratio[np.isfinite(ratio)], initial=0.0))
        for _ in range(_PRICE_STEPS):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if use(mid) > limit else (lo, mid)
        return hi

    def cpu_price(mu: float) -> float:
        return lowest_price(lambda lam: evaluate_prices(lam, mu)[1], cap_total, k)

    def slot_price(lam: float) -> float:
        return lowest_price(lambda mu: evaluate_prices(lam, mu)[2], nodes_total, n)

    lam, mu = cpu_price(0.0), 0.0
    for _ in range(_PRICE_ROUNDS if slots else 0):
        if mu == 0.0 and evaluate_prices(lam, mu)[2] <= nodes_total:
            break  # the slot total does not bind at mu = 0
        mu = slot_price(lam)
        lam = cpu_price(mu)
    best_sum, _, _, value, best_each = evaluate_prices(lam, mu)
    bound = lam * cap_total + mu * nodes_total + best_sum
    rc = np.empty(job.size)
    rc[order] = best_each - value
    return Relaxation(bound=float(bound), cpu_price=lam, slot_price=mu, reduced_cost=rc[: ch.job.size])


#: Arc kinds of the packing graph: a single-node job, a multi-node segment, the
#: end of a node's path, and (without interference avoidance) passing a job's layer.
_ITEM, _MULTI, _CLOSE, _SKIP = 0, 1, 2, 3

#: Vertex id of the sink of the packing graph.
_SINK = -1


@dataclass(frozen=True)
class _Data:
    """Index sets of one model: the options it offers, node states and the packing graph.

    Vertices of the packing graph are numbered ``layer * (C + 1) + level``.
    """

    opt: np.ndarray  # int64[O'] options offered (indices into the Choices), sorted
    excluded_rc: float  # smallest reduced cost among options not offered (inf if none)
    multi_jobs: np.ndarray  # int64[Jm] jobs with an offered multi-node option
    seg_max: np.ndarray  # int64[Jm] largest segment a multi-node job may put on one node
    holding: np.ndarray  # int64[H] nodes holding a job that may stay
    state_node: np.ndarray  # int64[T] position in ``holding`` of each node state
    state_res: np.ndarray  # int64[T] residual capacity r_t of the state
    state_slot: np.ndarray  # bool[T] the state's multi-node slot is taken
    slots: bool  # interference avoidance: layers F and I; else one layer per multi-node job, then I
    levels: int  # C, the largest capacity
    layers: int  # number of layers (the last is the items-only layer I)
    free_supply: dict  # vertex -> number of non-holding nodes entering there
    arc_tail: np.ndarray  # int64[A] vertex
    arc_head: np.ndarray  # int64[A] vertex, _SINK for close arcs
    arc_kind: np.ndarray  # int64[A] _ITEM, _MULTI, _CLOSE or _SKIP
    arc_size: np.ndarray  # int64[A] replicas the arc adds (0 for close and skip)
    arc_job: np.ndarray  # int64[A] position in multi_jobs of a layered segment arc, else -1

    def entry(self, residual: int, slot_taken: bool) -> int:
        """Vertex where a node with ``residual`` > 0 capacity enters the graph."""
        layer = self.layers - 1 if slot_taken else 0
        return layer * (self.levels + 1) + self.levels - residual


def _subset_sums(values: list[int], limit: int) -> list[int]:
    """Sorted distinct sums of subsets of ``values`` that are <= ``limit``."""
    sums = {0}
    for v in values:
        sums |= {s + v for s in sums if s + v <= limit}
    return sorted(sums)


def derive(
    problem: Problem,
    ch: Choices,
    offered: np.ndarray,
    excluded_rc: float = math.inf,
    slots: bool | None = None,
) -> _Data:
    """Node states and packing graph of a model offering options ``offered`` (pure).

    Args:
        problem: the allocation problem.
        ch: its choices (:func:`choices`).
        offered: bool[O] options the model may choose; keeps are always offered.
        excluded_rc: smallest reduced cost of an option not offered (for the bound).
        slots: at most one multi-node job per node (default: the problem's
            interference avoidance).  True without interference avoidance is a
            restriction (every such placement is feasible), used by the large
            formulation to avoid the graph with one layer per multi-node job.
    """
    opt = np.flatnonzero(offered)
    cur = problem.current
    slots = problem.interference_avoidance if slots is None else slots
    levels = int(problem.capacity.max()) if problem.num_nodes else 0
    is_multi = ch.hi[opt] > 1
    multi_jobs = np.unique(ch.job[opt][is_multi])
    seg = np.zeros(problem.num_jobs, dtype=np.int64)
    np.maximum.at(seg, ch.job[opt][is_multi], (ch.reps[opt] - ch.lo[opt] + 1)[is_multi])  # K - (N - 1)
    seg_max = np.minimum(seg[multi_jobs], levels)

    # Holding nodes and their states (residual after the kept jobs, slot taken).
    on_node = cur[ch.keep] > 0  # [Kp, N]
    holding = np.flatnonzero(on_node.any(axis=0))
    keep_multi = ch.keep_nodes > 1
    state_node, state_res, state_slot = [], [], []
    for i, n in enumerate(holding.tolist()):
        here = np.flatnonzero(on_node[:, n])
        cap_n = int(problem.capacity[n])
        if slots:
            single = _subset_sums(cur[ch.keep[here[~keep_multi[here]]], n].tolist(), cap_n)
            states = {(u, False) for u in single}
            multi_here = cur[ch.keep[here[keep_multi[here]]], n].tolist()
            states |= {(u + v, True) for v in multi_here for u in single if u + v <= cap_n}
        else:
            states = {(u, False) for u in _subset_sums(cur[ch.keep[here], n].tolist(), cap_n)}
        for u, taken in sorted(states):
            state_node.append(i)
            state_res.append(cap_n - u)
            state_slot.append(taken)

    layers = (2 if multi_jobs.size else 1) if slots else multi_jobs.size + 1
    last = layers - 1
    item_sizes = np.unique(ch.reps[opt][~is_multi]).tolist()

    def vertex(layer: int, level: int) -> int:
        return layer * (levels + 1) + level

    free_supply: dict = defaultdict(int)
    for cap_n in np.delete(problem.capacity, holding).tolist():
        free_supply[vertex(0, levels - cap_n)] += 1
    starts = set(free_supply) | {
        vertex(last if taken else 0, levels - res) for res, taken in zip(state_res, state_slot) if res > 0
    }

    # Arcs of the vertices reachable from the entry vertices.
    arcs = []  # (tail, head, kind, size, job position)
    frontier, seen = sorted(starts), set(starts)
    while frontier:
        v = frontier.pop()
        layer, level = divmod(v, levels + 1)
        room = levels - level
        if layer < last and not slots:  # layer of multi-node job ``layer``: pass, or add its segment
            outs = [(vertex(layer + 1, level), _SKIP, 0, -1)]
            sizes = range(1, min(room, seg_max[layer]) + 1)
            outs += [(vertex(layer + 1, level + s), _MULTI, s, layer) for s in sizes]
        else:
            outs = []
            if layer < last:  # fresh node, multi-node slot free
                sizes = range(1, min(room, seg_max.max()) + 1)
                outs += [(vertex(last, level + s), _MULTI, s, -1) for s in sizes]
            outs += [(vertex(last, level + k), _ITEM, k, -1) for k in item_sizes if k <= room]
            outs.append((_SINK, _CLOSE, 0, -1))
        for out in outs:
            arcs.append((v,) + out)
            if out[0] != _SINK and out[0] not in seen:
                seen.add(out[0])
                frontier.append(out[0])
    arcs.sort()
    arc = np.array(arcs, dtype=np.int64).reshape(-1, 5)
    return _Data(
        opt=opt,
        excluded_rc=float(excluded_rc),
        multi_jobs=multi_jobs,
        seg_max=seg_max,
        holding=holding,
        state_node=np.array(state_node, dtype=np.int64),
        state_res=np.array(state_res, dtype=np.int64),
        state_slot=np.array(state_slot, dtype=bool),
        slots=slots,
        levels=levels,
        layers=layers,
        free_supply=dict(free_supply),
        arc_tail=arc[:, 0],
        arc_head=arc[:, 1],
        arc_kind=arc[:, 2],
        arc_size=arc[:, 3],
        arc_job=arc[:, 4],
    )


def _groups(keys: np.ndarray, count: int) -> list[list[int]]:
    """``out[i]`` = positions p with ``keys[p] == i``, for i < count (keys >= count are dropped)."""
    keys = np.asarray(keys, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    bounds = np.searchsorted(keys[order], np.arange(count + 1)).tolist()
    flat = order.tolist()
    return [flat[bounds[i] : bounds[i + 1]] for i in range(count)]


def _model(problem: Problem, ch: Choices, d: _Data):
    """The Pyomo model over the options ``d.opt`` (see the module docstring).

    Built with Python's garbage collector paused (Pyomo's ``PauseGC``, as its
    writers do): the many small expression objects otherwise trigger full
    collections that cost four times the build itself on 5000 columns.
    """
    from pyomo.common.gc_manager import PauseGC

    with PauseGC():
        return _model_rules(problem, ch, d)


def _model_rules(problem: Problem, ch: Choices, d: _Data):
    """Variables, named constraint rules and objective of :func:`_model`."""
    import pyomo.environ as pyo

    o_job, o_reps, o_lo, o_hi = ch.job[d.opt], ch.reps[d.opt], ch.lo[d.opt], ch.hi[d.opt]
    num_opts, num_keep, num_multi, num_holding = d.opt.size, ch.keep.size, d.multi_jobs.size, d.holding.size
    num_nodes = problem.num_nodes
    shared_segments = d.slots and d.layers > 1

    # Index lists the rules read (numpy first, then plain lists).
    keep_pos = np.full(problem.num_jobs, -1, dtype=np.int64)
    keep_pos[ch.keep] = np.arange(num_keep)
    keep_pos = keep_pos.tolist()
    opts_of_job = _groups(o_job, problem.num_jobs)
    multi_pos = np.full(problem.num_jobs, num_multi, dtype=np.int64)
    multi_pos[d.multi_jobs] = np.arange(num_multi)
    is_multi = o_hi > 1
    multi_opts = _groups(np.where(is_multi, multi_pos[o_job], num_multi), num_multi)
    fixed_nodes = [bool(np.all(o_lo[o] == o_hi[o])) for o in multi_opts]
    lo, hi, reps = o_lo.tolist(), o_hi.tolist(), o_reps.tolist()
    seg_max = d.seg_max.tolist()
    seg_index = [(i, s) for i in range(num_multi) for s in range(1, seg_max[i] + 1)]
    seg_index = seg_index if shared_segments else []
    item_sizes = np.unique(o_reps[~is_multi]).tolist()
    singles_of_size = {k: np.flatnonzero(~is_multi & (o_reps == k)).tolist() for k in item_sizes}
    arcs_by = defaultdict(list)  # (kind, size, job position) -> arcs
    for a, key in enumerate(zip(d.arc_kind.tolist(), d.arc_size.tolist(), d.arc_job.tolist())):
        arcs_by[key].append(a)
    vertices = np.unique(d.arc_tail)
    arcs_out = _groups(np.searchsorted(vertices, d.arc_tail), vertices.size)
    head_pos = np.searchsorted(vertices, d.arc_head)
    inside = head_pos < vertices.size
    inside[inside] = vertices[head_pos[inside]] == d.arc_head[inside]
    arcs_in = _groups(np.where(inside, head_pos, vertices.size), vertices.size)
    vertices = vertices.tolist()
    states_of_node = _groups(d.state_node, num_holding)
    state_res, state_slot = d.state_res.tolist(), d.state_slot.tolist()
    states_at = defaultdict(list)
    for t, (res, taken) in enumerate(zip(state_res, state_slot)):
        if res > 0:
            states_at[d.entry(res, taken)].append(t)
    keep_multi = (ch.keep_nodes > 1).tolist()
    kept_here = [  # holding node -> (keep position, replicas there, multi-node)
        [(q, int(problem.current[ch.keep[q], n]), keep_multi[q]) for q in np.flatnonzero(column > 0).tolist()]
        for n, column in zip(d.holding.tolist(), problem.current[ch.keep][:, d.holding].T)
    ]
    # Objective coefficients against each job's best worth ``ref_j``, so that the
    # value of a good solution is a sum of small numbers (u(0) is -1e12 at p = -4).
    offered_job = np.concatenate([o_job, ch.keep])
    offered_worth = np.concatenate([ch.worth[d.opt], ch.keep_worth])
    ref = ch.idle_worth.copy()
    np.maximum.at(ref, offered_job, offered_worth)
    choosing = _choosing(problem, ch, d)
    constant = float(ref.sum())
    y_coef = (ch.worth[d.opt] - ref[o_job]).tolist()
    k_coef = (ch.keep_worth - ref[ch.keep]).tolist()
    z_coef = (ch.idle_worth[choosing] - ref[choosing]).tolist()
    z_pos = np.full(problem.num_jobs, -1, dtype=np.int64)
    z_pos[choosing] = np.arange(choosing.size)
    z_pos = z_pos.tolist()

    m = pyo.ConcreteModel(name="pollux_allocation")
    m.y = pyo.Var(range(num_opts), domain=pyo.Binary)  # job runs in option o (moved or started)
    m.k = pyo.Var(range(num_keep), domain=pyo.Binary)  # running job keeps its placement
    m.z = pyo.Var(range(choosing.size), domain=pyo.Binary)  # job that could run holds nothing
    count = {"domain": pyo.NonNegativeIntegers, "bounds": (0, num_nodes)}
    m.g = pyo.Var(seg_index, **count)  # nodes on which multi-node job i puts s replicas
    m.h = pyo.Var(range(d.state_node.size), domain=pyo.Binary)  # holding node is in state t
    m.f = pyo.Var(range(d.arc_tail.size), **count)  # nodes whose path uses arc a
    y, k, z, h, f = (list(v.values()) for v in (m.y, m.k, m.z, m.h, m.f))

    def segments_of(i):  # (size, variable) of multi-node job i's segments
        if shared_segments:
            return [(s, m.g[i, s]) for s in range(1, seg_max[i] + 1)]
        return [(s, f[a]) for s in range(1, seg_max[i] + 1) for a in arcs_by[_MULTI, s, i]]

    def one_choice(m, j):  # sum_o y[o] + k[j] + z[j] = 1
        if z_pos[j] < 0:
            return pyo.Constraint.Skip
        terms = [y[o] for o in opts_of_job[j]] + [z[z_pos[j]]]
        terms += [k[keep_pos[j]]] if keep_pos[j] >= 0 else []
        return _linear([1] * len(terms), terms) == 1

    def nodes_at_least(m, i):  # sum_s g[j,s] >= sum_o lo_o y[o]  (= when lo = hi)
        segs, opts = [v for _, v in segments_of(i)], multi_opts[i]
        expr = _linear([1] * len(segs) + [-lo[o] for o in opts], segs + [y[o] for o in opts])
        return expr == 0 if fixed_nodes[i] else expr >= 0

    def nodes_at_most(m, i):  # sum_s g[j,s] <= sum_o hi_o y[o]
        if fixed_nodes[i]:
            return pyo.Constraint.Skip
        segs, opts = [v for _, v in segments_of(i)], multi_opts[i]
        return _linear([1] * len(segs) + [-hi[o] for o in opts], segs + [y[o] for o in opts]) <= 0

    def multi_replicas(m, i):  # sum_s s g[j,s] = sum_o K_o y[o]
        sizes, segs = zip(*segments_of(i))
        opts = multi_opts[i]
        return _linear(list(sizes) + [-reps[o] for o in opts], list(segs) + [y[o] for o in opts]) == 0

    def segments(m, s):  # sum_j g[j,s] = sum_{multi arcs a of size s} f[a]
        gs = [m.g[i, s] for i in range(num_multi) if s <= seg_max[i]]
        arcs = arcs_by[_MULTI, s, -1]
        return _linear([1] * len(gs) + [-1] * len(arcs), gs + [f[a] for a in arcs]) == 0

    def single_items(m, size):  # sum_{o: single, K_o = k} y[o] = sum_{item arcs a of size k} f[a]
        opts, arcs = singles_of_size[size], arcs_by[_ITEM, size, -1]
        return _linear([1] * len(opts) + [-1] * len(arcs), [y[o] for o in opts] + [f[a] for a in arcs]) == 0

    def one_state(m, i):  # sum_t h[n,t] = 1
        return _linear([1] * len(states_of_node[i]), [h[t] for t in states_of_node[i]]) == 1

    def residual(m, i):  # sum_t r_t h[n,t] + sum_j cur[j,n] k[j] = cap_n
        coefs = [state_res[t] for t in states_of_node[i]] + [c for _, c, _ in kept_here[i]]
        terms = [h[t] for t in states_of_node[i]] + [k[q] for q, _, _ in kept_here[i]]
        return _linear(coefs, terms) == int(problem.capacity[d.holding[i]])

    def slot(m, i):  # sum_{t: slot taken} h[n,t] = sum_{j multi-node, kept on n} k[j]
        kept = [k[q] for q, _, multi in kept_here[i] if multi]
        if not kept:
            return pyo.Constraint.Skip
        taken = [h[t] for t in states_of_node[i] if state_slot[t]]
        return _linear([1] * len(taken) + [-1] * len(kept), taken + kept) == 0

    def flow(m, i):  # sum_{out of v} f[a] - sum_{into v} f[a] - sum_{t entering v} h[t] = free nodes at v
        v = vertices[i]
        outs, ins, states = arcs_out[i], arcs_in[i], states_at.get(v, ())
        coefs = [1] * len(outs) + [-1] * (len(ins) + len(states))
        terms = [f[a] for a in outs] + [f[a] for a in ins] + [h[t] for t in states]
        return _linear(coefs, terms) == d.free_supply.get(v, 0)

    m.one_choice = pyo.Constraint(range(problem.num_jobs), rule=one_choice)
    m.nodes_at_least = pyo.Constraint(range(num_multi), rule=nodes_at_least)
    m.nodes_at_most = pyo.Constraint(range(num_multi), rule=nodes_at_most)
    m.multi_replicas = pyo.Constraint(range(num_multi), rule=multi_replicas)
    m.segments = pyo.Constraint(sorted({s for _, s in seg_index}), rule=segments)
    m.single_items = pyo.Constraint(item_sizes, rule=single_items)
    m.one_state = pyo.Constraint(range(num_holding), rule=one_state)
    m.residual = pyo.Constraint(range(num_holding), rule=residual)
    m.slot = pyo.Constraint(range(num_holding) if d.slots else [], rule=slot)
    m.flow = pyo.Constraint(range(len(vertices)), rule=flow)

    def utility_sum(m):  # max U = sum_j ref_j + sum_o (w u_o - ref_j) y[o] + ... k[j] + (w u(0) - ref_j) z[j]
        return _linear(y_coef + k_coef + z_coef, y + k + z, constant=constant)

    m.U = pyo.Objective(rule=utility_sum, sense=pyo.maximize)
    return m


def _linear(coefs: list, variables: list, constant: float = 0.0):
    """``constant + sum_i coefs[i] * variables[i]`` as one Pyomo ``LinearExpression``.

    Built directly from the coefficient lists: about five times faster than
    ``sum(c * v ...)``, which creates and extends an expression per term.
    """
    from pyomo.core.expr.numeric_expr import LinearExpression

    return LinearExpression(constant=constant, linear_coefs=coefs, linear_vars=variables)


def build_model(problem: Problem, offered: np.ndarray | None = None):
    """Build the Pyomo model of ``problem`` (pure: same arguments, same model).

    Args:
        problem: the allocation problem.
        offered: bool[O] options of :func:`choices` the model may choose
            (default: all of them, which makes the model exact on its own).

    Returns:
        (model, choices, data): the ``pyomo.environ.ConcreteModel``, the
        problem's :class:`Choices`, and the index data that decodes the model.
    """
    ch = choices(problem)
    offered = np.ones(ch.job.size, dtype=bool) if offered is None else offered
    d = derive(problem, ch, offered)
    return _model(problem, ch, d), ch, d


def _choosing(problem: Problem, ch: Choices, d: _Data) -> np.ndarray:
    """int64[Jz]: jobs with an offered option or a keep (those with a z variable), sorted."""
    jobs = np.concatenate([ch.job[d.opt], ch.keep])
    return np.flatnonzero(np.bincount(jobs, minlength=problem.num_jobs) > 0)


def _kept_in(problem: Problem, ch: Choices, placement: np.ndarray) -> np.ndarray:
    """bool[Kp]: running jobs whose row of ``placement`` equals their current placement."""
    return np.all(placement[ch.keep] == problem.current[ch.keep], axis=1)


def _start_placement(problem: Problem, ch: Choices, slots: bool) -> np.ndarray:
    """The current placement, less what the model cannot keep.

    Jobs whose current shape is no longer allowed hold nothing.  With ``slots``
    (at most one multi-node job per node), where two multi-node jobs share a
    node the later ones hold nothing.
    """
    start = np.zeros_like(problem.current)
    taken = np.zeros(problem.num_nodes, dtype=bool)
    for j, nodes in zip(ch.keep.tolist(), ch.keep_nodes.tolist()):
        on = problem.current[j] > 0
        if nodes > 1 and slots:
            if np.any(taken[on]):
                continue
            taken |= on
        start[j] = problem.current[j]
    return start


def _encode(problem: Problem, ch: Choices, d: _Data, placement: np.ndarray) -> dict | None:
    """Variable values (by name) of a feasible ``placement``, or None if the model cannot express it.

    Used for warm starts.  Unchanged running jobs are kept (k = 1); each moved
    or started job takes the offered option with its replicas and node count;
    each node's path takes its multi-node segment first, then its single-node
    jobs by decreasing size, then closes (skip arcs on layers it has no segment of).
    """
    kept = _kept_in(problem, ch, placement) & (placement[ch.keep].sum(axis=1) > 0)
    values = {"y": np.zeros(d.opt.size), "k": kept.astype(np.float64), "g": defaultdict(float)}
    values["z"] = (placement.sum(axis=1)[_choosing(problem, ch, d)] == 0).astype(np.float64)
    moving = np.ones(problem.num_jobs, dtype=bool)
    moving[ch.keep[kept]] = False
    reps, nodes = placement.sum(axis=1), (placement > 0).sum(axis=1)
    o_job, o_reps, o_lo, o_hi = ch.job[d.opt], ch.reps[d.opt], ch.lo[d.opt], ch.hi[d.opt]
    for j in np.flatnonzero(moving & (reps > 0)).tolist():
        fits = np.flatnonzero(
            (o_job == j)
            & (o_reps == reps[j])
            & (o_lo <= nodes[j])
            & (o_hi >= nodes[j])
            & ((o_hi > 1) == (nodes[j] > 1))
        )
        if fits.size == 0:
            return None
        values["y"][fits[0]] = 1.0
    used = problem.current[ch.keep[kept]].sum(axis=0)
    taken = np.zeros(problem.num_nodes, dtype=bool)
    if d.slots:
        for j in ch.keep[kept & (ch.keep_nodes > 1)].tolist():
            taken |= problem.current[j] > 0
    node = d.holding[d.state_node]
    h = (problem.capacity[node] - used[node] == d.state_res) & (taken[node] == d.state_slot)
    if np.bincount(d.state_node[h], minlength=d.holding.size).tolist() != [1] * d.holding.size:
        return None
    values["h"] = h.astype(np.float64)
    keys = zip(d.arc_tail.tolist(), d.arc_kind.tolist(), d.arc_size.tolist(), d.arc_job.tolist())
    arc_of = {key: a for a, key in enumerate(keys)}
    multi_pos = {j: i for i, j in enumerate(d.multi_jobs.tolist())}
    flow = np.zeros(d.arc_tail.size)
    for n in range(problem.num_nodes):
        residual = int(problem.capacity[n] - used[n])
        if residual == 0:
            continue
        pieces = placement[:, n] * moving
        multi = [(j, int(pieces[j])) for j in np.flatnonzero((pieces > 0) & (nodes > 1)).tolist()]
        singles = sorted((int(pieces[j]) for j in np.flatnonzero((pieces > 0) & (nodes == 1))), reverse=True)
        v = d.entry(residual, bool(taken[n]))
        steps = []
        if d.slots:
            if len(multi) > 1 or (multi and taken[n]):
                return None
            steps += [(_MULTI, s, -1) for _, s in multi]
            for j, s in multi:
                values["g"][multi_pos[j], s] += 1.0
        else:
            on = dict((multi_pos.get(j, -1), s) for j, s in multi)
            steps += [(_MULTI, on[t], t) if t in on else (_SKIP, 0, -1) for t in range(d.layers - 1)]
        steps += [(_ITEM, s, -1) for s in singles] + [(_CLOSE, 0, -1)]
        for kind, size, jpos in steps:
            a = arc_of.get((v, kind, size, jpos))
            if a is None:
                return None
            flow[a] += 1
            v = int(d.arc_head[a])
    values["f"] = flow
    return values


def _decode(problem: Problem, ch: Choices, d: _Data, values: dict) -> np.ndarray:
    """int64[J, N] placement from the rounded variable values of a solution.

    The arc flow is split into one path per node: each node starts at its entry
    vertex and follows any arc with flow left until it closes.  Pieces on the
    path are handed out by size: single-node jobs to item arcs, multi-node
    segments to multi arcs (to the layer's own job without interference avoidance).
    """
    placement = np.zeros_like(problem.current)
    for j in ch.keep[values["k"] > 0].tolist():
        placement[j] = problem.current[j]
    chosen = d.opt[values["y"] > 0]
    single = chosen[ch.hi[chosen] == 1]
    singles = defaultdict(list)  # size -> single-node jobs waiting for an item arc
    for j, k in zip(ch.job[single].tolist(), ch.reps[single].tolist()):
        singles[k].append(j)
    segments = defaultdict(list)  # size -> multi-node jobs waiting for a multi arc
    for (i, s), count in values["g"].items():
        segments[s] += [int(d.multi_jobs[i])] * int(count)
    flow = np.asarray(values["f"]).copy()
    out = defaultdict(list)
    for a, t in enumerate(d.arc_tail.tolist()):
        out[t].append(a)
    h = values["h"] > 0
    free = np.delete(np.arange(problem.num_nodes), d.holding)
    entries = [(n, d.entry(c, False)) for n, c in zip(free.tolist(), problem.capacity[free].tolist())]
    entries += [
        (int(d.holding[i]), d.entry(int(r), bool(s)))
        for i, r, s in zip(d.state_node[h], d.state_res[h], d.state_slot[h])
        if r > 0
    ]
    for n, v in entries:
        while v != _SINK:
            a = next((a for a in out[v] if flow[a] > 0), None)
            if a is None:  # inconsistent flow: stop here; the feasibility check reports it
                break
            flow[a] -= 1
            kind, size, jpos = int(d.arc_kind[a]), int(d.arc_size[a]), int(d.arc_job[a])
            if kind == _ITEM and singles[size]:
                placement[singles[size].pop(), n] += size
            elif kind == _MULTI and jpos >= 0:
                placement[d.multi_jobs[jpos], n] += size
            elif kind == _MULTI and segments[size]:
                placement[segments[size].pop(), n] += size
            v = int(d.arc_head[a])
    return placement


def _compile(model):
    """Pyomo model -> (c, offset, A (csr), row_lo, row_up, col_lo, col_up, integrality, columns)."""
    from pyomo.common.enums import ObjectiveSense
    from pyomo.repn.plugins.standard_form import LinearStandardFormCompiler

    info = LinearStandardFormCompiler().write(model, mixed_form=True, set_sense=ObjectiveSense.maximize)
    ncol = len(info.columns)
    c = np.asarray(info.c.toarray()).reshape(-1)[:ncol] if ncol else np.zeros(0)
    offset = float(np.asarray(info.c_offset).reshape(-1)[0]) if len(info.c_offset) else 0.0
    rhs = np.asarray(info.rhs, dtype=np.float64)
    sense = np.array([mult for _, mult in info.rows], dtype=np.int64)
    row_lower = np.where(sense <= 0, rhs, -np.inf)
    row_upper = np.where(sense >= 0, rhs, np.inf)
    col_lower = np.array([v.lb if v.lb is not None else -np.inf for v in info.columns], dtype=np.float64)
    col_upper = np.array([v.ub if v.ub is not None else np.inf for v in info.columns], dtype=np.float64)
    integrality = np.array([1 if v.is_integer() else 0 for v in info.columns], dtype=np.int32)
    return c, offset, info.A.tocsr(), row_lower, row_upper, col_lower, col_upper, integrality, info.columns


@functools.cache
def _silence_banner() -> bool:
    """Create the process's first ``highspy.Highs`` with stdout captured (once).

    HiGHS prints its banner from C++ when the first instance of a process is
    created; it would corrupt the JSON that ``pollux-opt allocate`` writes to
    stdout.  Capturing the file descriptor costs milliseconds, so it is done once.
    """
    import highspy
    from pyomo.common.tee import capture_output

    with capture_output(capture_fd=True):
        highspy.Highs()
    return True


def _new_highs():
    """A fresh ``highspy.Highs`` (the start-up banner kept off stdout)."""
    import highspy

    _silence_banner()
    return highspy.Highs()


#: HiGHS ``primal_solution_status`` value of a feasible primal solution (kSolutionStatusFeasible).
_PRIMAL_FEASIBLE = 2

#: Relative tolerance when checking HiGHS's primal against its reported objective.
_OBJECTIVE_RTOL = 1e-6

#: A relaxed LP solution counts as integral when every integer column is this
#: close to an integer (HiGHS's own MIP feasibility tolerance is 1e-6).
_INTEGRALITY_TOL = 1e-7

#: Row activity tolerance when accepting a rounded LP solution (HiGHS's primal feasibility tolerance).
_ROW_TOL = 1e-7

#: Shortest time limit handed to HiGHS (it rejects 0) when the budget is spent building.
_MIN_TIME_LIMIT = 1e-3


@dataclass
class _Run:
    """Outcome of one HiGHS run on one model."""

    values: dict | None  # rounded variable values by name, None without a solution
    model_status: object  # highspy.HighsModelStatus
    bound: float  # dual bound on the model's utility sum (nan if none)
    message: str
    mip_nodes: int  # -1 when the LP relaxation was already integral
    columns: int
    rows: int


def _primal_matches_objective(h, c: np.ndarray, offset: float, info) -> bool:
    """True when ``c @ x + offset`` of HiGHS's primal equals its reported objective."""
    x = np.asarray(h.getSolution().col_value)
    value = float(c @ x + offset)
    reported = float(info.objective_function_value)
    return abs(value - reported) <= _OBJECTIVE_RTOL * max(1.0, abs(reported))


def _run_highs(
    model, compiled, start: dict | None, *, time_limit, mip_gap, threads, verbose, seed, dive=False
) -> _Run:
    """Solve ``model`` (compiled by :func:`_compile`): its LP relaxation, then the MIP if that is fractional.

    An integral optimum of the LP relaxation is an optimum of the MIP, and on
    most small instances here the arc-flow relaxation is integral
    (docs/formulation.md), so this skips HiGHS's MIP set-up (presolve,
    probing, heuristics), which costs several times the LP itself.

    With ``dive`` (the large formulation), a fractional LP is followed by a MIP
    in which every choice the LP made whole (y or k at 1) is fixed; only the
    undecided jobs and the packing stay free.  That MIP is small and fast; its
    answer is feasible but not proven optimal, so the bound returned is the LP
    optimum.  If it finds nothing, the full MIP runs.
    """
    import highspy

    c, offset, A, rlo, rhi, clo, chi, integrality, columns = compiled
    pos = {id(v): i for i, v in enumerate(columns)}
    names = ("y", "k", "z", "g", "h", "f")
    index = {
        name: np.array([pos.get(id(v), -1) for v in getattr(model, name).values()], dtype=np.int64)
        for name in names
    }

    def values_of(x: np.ndarray) -> dict:
        out = {name: np.where(index[name] >= 0, x[np.maximum(index[name], 0)], 0.0) for name in names}
        out["g"] = dict(zip(model.g.keys(), out["g"].tolist()))
        return out

    deadline = None if time_limit is None else time.perf_counter() + time_limit
    h = _new_highs()
    h.setOptionValue("output_flag", bool(verbose))
    h.setOptionValue("mip_rel_gap", float(mip_gap))
    if threads is not None:
        # HiGHS sizes one process-wide thread pool at its first run and fails
        # ("Not Set") when a later run asks for another size; reset it first.
        highspy.Highs.resetGlobalScheduler(True)
        h.setOptionValue("threads", int(threads))
    if seed is not None:
        h.setOptionValue("random_seed", int(seed))

    def set_time_limit() -> None:
        if deadline is not None:
            h.setOptionValue("time_limit", max(deadline - time.perf_counter(), _MIN_TIME_LIMIT))

    h.passModel(
        len(columns),
        A.shape[0],
        A.nnz,
        int(highspy.MatrixFormat.kRowwise),
        int(highspy.ObjSense.kMaximize),
        offset,
        c,
        clo,
        chi,
        rlo,
        rhi,
        A.indptr.astype(np.int32),
        A.indices.astype(np.int32),
        A.data.astype(np.float64),
        np.zeros_like(integrality),  # the LP relaxation first
    )
    set_time_limit()
    h.run()
    ints = np.flatnonzero(integrality)
    lp_optimal = h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    if lp_optimal:
        lp_bound = float(h.getInfo().objective_function_value)
        x = np.asarray(h.getSolution().col_value)
        rounded = x.copy()
        rounded[ints] = np.rint(x[ints])
        activity = A @ rounded
        if (
            np.all(np.abs(x[ints] - rounded[ints]) <= _INTEGRALITY_TOL)
            and np.all(activity >= rlo - _ROW_TOL)
            and np.all(activity <= rhi + _ROW_TOL)
        ):
            return _Run(
                values=values_of(rounded),
                model_status=highspy.HighsModelStatus.kOptimal,
                bound=lp_bound,
                message="LP relaxation integral",
                mip_nodes=-1,
                columns=len(columns),
                rows=int(A.shape[0]),
            )

    h.changeColsIntegrality(ints.size, ints.astype(np.int32), np.ones(ints.size, dtype=np.uint8))
    if dive and lp_optimal:
        choice = np.concatenate([index["y"], index["k"]])
        decided = choice[(choice >= 0)]
        decided = decided[x[decided] >= 1 - _INTEGRALITY_TOL].astype(np.int32)
        h.changeColsBounds(decided.size, decided, np.ones(decided.size), np.ones(decided.size))
        set_time_limit()
        h.run()
        info = h.getInfo()
        if info.primal_solution_status == _PRIMAL_FEASIBLE:
            x = np.asarray(h.getSolution().col_value)
            x[ints] = np.rint(x[ints])
            return _Run(
                values=values_of(x),
                model_status=highspy.HighsModelStatus.kOptimal,
                bound=lp_bound,
                message="LP dive: choices the LP made whole fixed, the rest solved as a MIP",
                mip_nodes=int(info.mip_node_count),
                columns=len(columns),
                rows=int(A.shape[0]),
            )
        h.changeColsBounds(decided.size, decided, clo[decided], chi[decided])
        h.clearSolver()
    if start is not None:
        x0 = np.zeros(len(columns))
        for name in names:
            if name == "g":
                vals = np.array([start["g"].get(key, 0.0) for key in model.g.keys()])
            else:
                vals = start[name]
            mask = index[name] >= 0
            x0[index[name][mask]] = np.asarray(vals, dtype=np.float64)[mask]
        sol = highspy.HighsSolution()
        sol.col_value = x0.tolist()
        sol.value_valid = True
        h.setSolution(sol)
    set_time_limit()
    h.run()
    info = h.getInfo()
    has_solution = info.primal_solution_status == _PRIMAL_FEASIBLE
    if has_solution and not _primal_matches_objective(h, c, offset, info):
        # HiGHS 1.16 can report the optimum of a presolved run yet hand back the
        # user's start as its primal solution; solving again without the start
        # returns the primal that goes with the reported objective.
        log.warning("HiGHS primal does not match its objective; re-solving without the warm start")
        h.clearSolver()
        h.setSolution(highspy.HighsSolution())
        set_time_limit()
        h.run()
        info = h.getInfo()
        has_solution = info.primal_solution_status == _PRIMAL_FEASIBLE
    model_status = h.getModelStatus()
    values = None
    if has_solution:
        x = np.asarray(h.getSolution().col_value)
        x[ints] = np.rint(x[ints])
        values = values_of(x)
    bound = float(info.mip_dual_bound)
    return _Run(
        values=values,
        model_status=model_status,
        bound=bound if math.isfinite(bound) else float("nan"),
        message=h.modelStatusToString(model_status),
        mip_nodes=int(info.mip_node_count),
        columns=len(columns),
        rows=int(A.shape[0]),
    )


def _check_options(problem, time_limit, mip_gap, formulation) -> None:
    check_problem(problem)
    check_time_limit(time_limit)
    if isinstance(mip_gap, bool) or not isinstance(mip_gap, (int, float)) or not 0 <= mip_gap < 1:
        raise InvalidProblem(f"mip_gap must be in [0, 1), got {mip_gap!r}")
    if not isinstance(formulation, str) or formulation not in FORMULATIONS:
        raise InvalidProblem(f"formulation must be one of {list(FORMULATIONS)}, got {formulation!r}")


def choose_formulation(problem: Problem, formulation: str = "auto") -> str:
    """``"exact"`` or ``"large"``: ``formulation`` itself, or by total CPUs for ``"auto"``."""
    if formulation != "auto":
        return formulation
    return "large" if int(problem.capacity.sum()) >= AUTO_LARGE_CPUS else "exact"


def _first_offer(problem: Problem, ch: Choices, rel: Relaxation) -> np.ndarray:
    """bool[O]: options of the exact solve's first round (see ``FIRST_ROUND_REL``)."""
    return rel.reduced_cost <= FIRST_ROUND_REL * max(abs(rel.bound), float(problem.weight.sum()))


def _utility_sum(problem: Problem, placement: np.ndarray) -> float:
    """``sum_j w_j u(x_j)`` of a feasible placement (the model's objective scale)."""
    return float(np.sum(problem.weight * utility(job_values(problem, placement), problem.p)))


def solve_milp(
    problem: Problem,
    *,
    time_limit: float | None = None,
    mip_gap: float = DEFAULT_MIP_GAP,
    formulation: str = "auto",
    threads: int | None = None,
    verbose: bool = False,
    seed: int | None = None,
) -> Result:
    """Solve ``problem`` with the arc-flow MILP (see the module docstring).

    Args:
        problem: the allocation problem.
        time_limit: wall-clock seconds for the whole solve, build included
            (None: no limit).  On expiry the best feasible placement is
            returned with ``Status.TIME_LIMIT``, or the current placement with
            ``Status.TIME_LIMIT_NO_SOLUTION``.
        mip_gap: relative gap (on the utility sum) at which a solve stops.
        formulation: ``"exact"``, ``"large"`` (:mod:`solvers._milp_large`:
            each job restricted to its few best options by reduced cost; a
            feasible answer with an honest bound, ``Status.FEASIBLE`` unless the
            bound proves it within ``mip_gap``), or ``"auto"``: large from
            ``AUTO_LARGE_CPUS`` CPUs on, exact below.
        threads: HiGHS threads (None: HiGHS default).
        verbose: stream the HiGHS log to stdout.
        seed: HiGHS ``random_seed`` (None: HiGHS default).

    Returns:
        A :class:`Result`; ``objective`` is recomputed from the placement and
        ``bound`` is a proven upper bound on the optimum, both on the
        power-mean scale.  ``stats["formulation"]`` names the formulation used.

    Raises:
        InvalidProblem: if ``problem`` is not a :class:`Problem`, ``time_limit``
            is not a positive number, ``mip_gap`` is outside [0, 1) or
            ``formulation`` is unknown.
    """
    _check_options(problem, time_limit, mip_gap, formulation)
    if not HIGHS_STATUS:
        HIGHS_STATUS.update(_highs_status_table())
    import highspy
    import pyomo.environ  # noqa: F401  (one-off import cost stays out of build_seconds)

    _new_highs()  # the one-off HiGHS banner, too
    ms = highspy.HighsModelStatus
    chosen = choose_formulation(problem, formulation)
    t0 = time.perf_counter()
    deadline = None if time_limit is None else t0 + time_limit
    ch = choices(problem)
    rel = relax(problem, ch)
    rc = rel.reduced_cost
    scale = max(abs(rel.bound), 1.0)
    if chosen == "large":
        from ._milp_large import offer

        offered = offer(problem, ch, rel)
    else:
        offered = _first_offer(problem, ch, rel)
    slots = problem.interference_avoidance or chosen == "large"
    slots_restricted = slots and not problem.interference_avoidance
    start = _start_placement(problem, ch, slots)
    best, best_value = None, -math.inf
    build_seconds = solve_seconds = 0.0
    rounds, bound, run = 0, rel.bound, None
    t1 = t0
    while True:
        rounds += 1
        excluded_rc = float(np.min(rc[~offered], initial=math.inf))
        d = derive(problem, ch, offered, excluded_rc, slots)
        model = _model(problem, ch, d)
        compiled = _compile(model)
        warm = _encode(problem, ch, d, start)
        t2 = time.perf_counter()
        remaining = None if deadline is None else max(deadline - t2, _MIN_TIME_LIMIT)
        run = _run_highs(
            model,
            compiled,
            warm,
            time_limit=remaining,
            mip_gap=mip_gap,
            threads=threads,
            verbose=verbose,
            seed=seed,
            dive=chosen == "large",
        )
        if run.values is not None:
            placement = _decode(problem, ch, d, run.values)
            broken = violations(problem, placement)
            if broken:
                log.error("HiGHS returned a solution that decodes to an infeasible placement: %s", broken)
            else:
                value = _utility_sum(problem, placement)
                if value > best_value:
                    best, best_value = placement, value
        t3 = time.perf_counter()
        build_seconds += t2 - t1
        solve_seconds += t3 - t2  # HiGHS and decoding its answer
        # Every placement worth more than rel.bound - excluded_rc uses offered options only,
        # so the model's bound holds for the problem unless the slots are a restriction.
        model_bound = run.bound if math.isfinite(run.bound) and not slots_restricted else rel.bound
        bound = min(rel.bound, max(model_bound, rel.bound - excluded_rc, best_value))
        certified = rel.bound - excluded_rc <= best_value + _UTILITY_RTOL * scale and not slots_restricted
        timed_out = run.model_status in (ms.kTimeLimit, ms.kInterrupt)
        if chosen == "large" or certified or best is None or timed_out or offered.all():
            break
        # Second round: every option that a placement better than ``best`` could use.
        offered = offered | (rc <= rel.bound - best_value + _UTILITY_RTOL * scale)
        start = best
        t1 = time.perf_counter()

    has_solution = best is not None
    status = HIGHS_STATUS.get(run.model_status, (Status.ERROR, Status.ERROR))[0 if has_solution else 1]
    slack = mip_gap * max(abs(bound), abs(best_value)) + _UTILITY_RTOL * scale
    within_gap = has_solution and bound - best_value <= slack
    if has_solution and status is Status.OPTIMAL and not within_gap and not certified:
        status = Status.FEASIBLE  # optimal among the offered options only
    elif has_solution and within_gap:
        status = Status.OPTIMAL
    placement = best if has_solution else problem.current.copy()
    objective = evaluate(problem, placement) if not violations(problem, placement) else float("nan")
    w_sum = float(problem.weight.sum())
    if w_sum == 0:
        bound_mean = objective  # no jobs: the empty placement is all there is
    else:
        bound_mean = mean_from_utility_sum(bound, w_sum, problem.p)
        bound_mean = max(bound_mean, objective) if math.isfinite(objective) else bound_mean
    gap = float("nan")
    if math.isfinite(bound_mean) and bound_mean != 0:
        gap = (bound_mean - objective) / abs(bound_mean)
    return Result(
        placement=placement,
        status=status,
        objective=objective,
        bound=bound_mean,
        gap=max(gap, 0.0) if math.isfinite(gap) else gap,
        build_seconds=build_seconds,
        solve_seconds=solve_seconds,
        solver="milp",
        message=run.message,
        stats={
            "formulation": chosen,
            "rounds": rounds,
            "options": int(ch.job.size),
            "options_offered": int(offered.sum()),
            "columns": run.columns,
            "rows": run.rows,
            "mip_nodes": run.mip_nodes,
            "relaxation_bound": mean_from_utility_sum(rel.bound, w_sum, problem.p) if w_sum else 0.0,
        },
    )
