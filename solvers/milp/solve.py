"""The "milp" solver: the stages of :mod:`solvers.milp` run in rounds by one formulation.

Solve.  (1) :func:`~solvers.milp.bound.relax` prices CPUs (and multi-node
slots) in the aggregated relaxation: a Lagrangian bound L >= optimum and a
reduced cost rc_o per option, any placement using o being worth at most
L - rc_o.  (2) The formulation (:mod:`solvers.milp.strategy`) offers a set
of options; a placement worth more than L - min_{o not offered} rc_o uses
offered options only, so if a round's best placement reaches that value it
is optimal, and otherwise the formulation may widen the offer for another
round.  (3) Each round builds the model over the offered options, solves
its LP relaxation first and runs the MIP only if it is fractional,
warm-started from the current placement (a later round from the best one
so far; typed problems without a warm start, first trying to pack the
LP's choices when they are integral, see
:func:`~solvers.milp.highs.run_highs`).  (4) HiGHS statuses map to
:class:`solvers.Status` through :func:`~solvers.milp.highs.highs_status`.  The objective reported is
recomputed from the placement with :func:`solvers.evaluate`.

Limits (:mod:`solvers.milp.budget`).  Every stage checks the deadline, and
the packing graph and model are sized before they are built.  When the time
runs out before a round is solved, the answer is the best of the rounds so
far and the warm start (``Status.TIME_LIMIT``); when the model would be too
large, it is the greedy solver's answer (:func:`solvers.greedy.solve_greedy`,
in the time left), against the relaxation's bound.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from typing import Any
from dataclasses import dataclass, replace

import numpy as np

from ..objective import power_mean
from ..placement import job_values, violations_and_values
from ..problem import Problem
from ..result import Result, Status
from .bound import Relaxation, relax
from ..errors import OutOfTime
from .budget import MODEL_SECONDS_PER_COLUMN, Budget, TooLarge
from .highs import SMALL_TYPED_OPTIONS, highs_status, result_status, run_highs, stopped_early
from .highs_model import MIN_TIME_LIMIT, TYPED_DIVE_GAP, HighsRun, silence_banner
from .compiled import STRUCTURE_CACHE_SIZE, StructureCache, compiled_model
from .options import DEFAULT_MIP_GAP, UTILITY_RTOL, OptionTable, check_options, option_table
from .greedy_pack import pack_choices, repair_choices
from .packing import PackingGraph, packing_graph
from .strategy import Formulation, choose_formulation
from .warmstart import decode_placement, start_placement, warm_start_values

__all__ = ["MAX_ROUNDS", "MilpSolver", "solve_milp", "utility_sum"]

log = logging.getLogger(__name__)

#: Set-up time of the greedy per configuration (sorting them, the utility
#: scale): 0.25 s for 4.4 million on the 2-core machine under load, doubled.
#: The fallback greedy starts only with at least this much time per
#: configuration left.
GREEDY_SECONDS_PER_CONFIG = 1e-7

#: Typed models up to this many columns run HiGHS with
#: :data:`~solvers.milp.highs.SMALL_TYPED_OPTIONS` (Sia's 64-GPU cluster with
#: 40 jobs makes about 450 columns).  Typed MIPs of any size run without a
#: warm start: HiGHS's handling of the start cost more than half of the MIP
#: (Sia's cluster: about 20 of 50 ms; 2048 GPUs, 1000 jobs: 0.8 of 1.9 s),
#: and the start stays a candidate answer when the time runs out.
SMALL_TYPED_COLUMNS = 2000

#: Most rounds of one solve.  The exact formulation needs two (the second
#: offers every option a better placement could use); the cap only stops
#: float noise from widening the offer step by step.
MAX_ROUNDS = 4


class MilpSolver:
    """The "milp" solver and the compiled model structures its solves share (:attr:`structures`).

    A later round of a cached structure (same jobs, options offered, placement
    and capacities) only writes its objective into the cached columns.  The
    registry (:data:`solvers.SOLVERS`) keeps one per process (each worker
    process of a simulation sweep has its own); :func:`solve_milp` solves once
    with one of its own.
    """

    def __init__(self, structure_cache_size: int = STRUCTURE_CACHE_SIZE) -> None:
        self.structures = StructureCache(structure_cache_size)

    def __call__(
        self,
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
                (None: no limit).  On expiry the best feasible placement found
                (at least the warm start: the current placement, less what is no
                longer allowed) is returned with ``Status.TIME_LIMIT``.
            mip_gap: relative gap (on the utility sum) at which a solve stops.
            formulation: ``"exact"``, ``"large"``
                (:class:`~solvers.milp.strategy.RestrictedFormulation`: each job
                restricted to its few best options by reduced cost; a feasible
                answer with an honest bound, ``Status.FEASIBLE`` unless the bound
                proves it within ``mip_gap``), or ``"auto"``: large from
                ``AUTO_LARGE_OPTIONS`` options (the size of the exact model) on,
                exact below (:func:`~solvers.milp.strategy.choose_formulation`).
            threads: HiGHS threads (None: HiGHS default).
            verbose: stream the HiGHS log to stdout.
            seed: HiGHS ``random_seed`` (None: HiGHS default).

        Returns:
            A :class:`Result`; ``objective`` is recomputed from the placement and
            ``bound`` is a proven upper bound on the optimum, both on the
            power-mean scale.  ``stats["formulation"]`` names the formulation used,
            ``stats["fallback"]`` the answer's source when no round finished
            (``"warm start"`` or ``"greedy"``; absent otherwise), and
            ``stats["highs_overrun_seconds"]`` how long HiGHS ran past the time
            limit (absent when it did not: its presolve and root node do not
            always read the clock).

        Raises:
            InvalidProblem: if ``problem`` is not a :class:`Problem`, ``time_limit``
                is not a positive number, ``mip_gap`` is outside [0, 1) or
                ``formulation`` is unknown.
        """
        check_options(problem, time_limit, mip_gap, formulation)
        highs_status()
        import highspy  # noqa: F401
        import pyomo.environ  # noqa: F401  (one-off import cost stays out of build_seconds)
        from pyomo.common.dependencies import scipy as pyomo_scipy

        # Pyomo imports scipy (scipy.stats too) lazily, at the first model compiled:
        # one to ten seconds on a loaded machine, which would eat the first time limit.
        pyomo_scipy.sparse.csc_array  # noqa: B018  (resolves the deferred import)

        silence_banner()  # the one-off HiGHS banner, too
        t0 = time.perf_counter()
        budget = Budget.starting_now(time_limit, problem.num_configs)
        table = option_table(problem)
        chosen = choose_formulation(problem, formulation, table)
        rel = _finite(relax(problem, table, budget.deadline))
        highs_options = {"mip_gap": mip_gap, "threads": threads, "verbose": verbose, "seed": seed}
        rounds = _solve_rounds(problem, chosen, table, rel, t0, budget, (highs_options, self.structures))
        status = _status(rounds, rel, mip_gap)
        return _result(problem, chosen, table, rel, rounds, status)


def solve_milp(problem: Problem, **options: Any) -> Result:
    """Solve ``problem`` once with a :class:`MilpSolver` of its own (``options`` as its call takes them)."""
    return MilpSolver()(problem, **options)


def utility_sum(problem: Problem, placement: np.ndarray, table: OptionTable | None = None) -> float:
    """``sum_j w_j u(x_j)`` of a feasible placement on the model's scale (``table.scale``).

    ``table`` defaults to :func:`~solvers.milp.options.option_table` of ``problem``.
    """
    table = option_table(problem) if table is None else table
    return _utility_of(problem, job_values(problem, placement), table)


def _utility_of(problem: Problem, values: np.ndarray, table: OptionTable) -> float:
    """:func:`utility_sum` of a placement whose job values (:func:`solvers.job_values`) are ``values``."""
    scale = table.scale
    w = problem.weight if scale.weight_scale == 1 else problem.weight * scale.weight_scale
    return float(np.sum(w * scale(values)))


def _finite(rel: Relaxation) -> Relaxation:
    """``rel`` with a nan bound made +inf (no bound) and nan reduced costs 0 (offered), logged.

    Inside the problem's domain the utilities are finite and this never
    fires; it keeps float trouble from making the round loop spin.
    """
    if math.isfinite(rel.bound) and not np.isnan(rel.reduced_cost).any():
        return rel
    log.warning("relaxation bound %r or reduced costs not finite; solving without them", rel.bound)
    bound = rel.bound if math.isfinite(rel.bound) else math.inf
    return replace(rel, bound=bound, reduced_cost=np.nan_to_num(rel.reduced_cost, nan=0.0))


@dataclass
class _Rounds:
    """Where the rounds of one solve ended (utility-sum scale)."""

    best: np.ndarray | None  # int64[J, N] best feasible placement found, None if none
    best_value: float  # its utility sum (-inf if none)
    bound: float  # upper bound on the utility sum of every feasible placement
    certified: bool  # the last round's offer provably contains an optimum
    run: HighsRun | None  # the last HiGHS run, None if none finished
    count: int  # rounds run
    offered: np.ndarray  # bool[O] options of the last round
    build_seconds: float
    solve_seconds: float
    stopped: str = ""  # "" (rounds finished), "time" or "size": why they were cut short
    fallback: str = ""  # source of the answer when they were: "warm start" or "greedy"
    message: str = ""  # why they were cut short, and the answer's source
    timed_out: bool = False  # the time limit cut the solve short
    highs_overrun: float = 0.0  # seconds HiGHS ran past the deadline
    best_values: np.ndarray | None = None  # float64[J] job values of ``best`` (solvers.job_values)


def _solve_rounds(
    problem: Problem,
    formulation: Formulation,
    table: OptionTable,
    rel: Relaxation,
    t0: float,
    budget: Budget,
    highs: tuple[dict, StructureCache],
) -> _Rounds:
    """Solve rounds of offered options until one is certified, times out, or the formulation stops.

    ``highs``: HiGHS's options for every run, and the structures the rounds
    compile their models from (:attr:`MilpSolver.structures`).

    A round cut short by the deadline or the size limits ends the loop; the
    answer is then completed by :func:`_fall_back`.
    """
    offered = formulation.offered(problem, table, rel)
    slots = formulation.slots(problem)
    start = start_placement(problem, table, slots)
    out = _Rounds(None, -math.inf, rel.bound, False, None, 0, offered, 0.0, 0.0)
    try:
        _run_rounds(problem, formulation, table, rel, (t0, budget, *highs), out, start)
    except OutOfTime:
        out.stopped, out.message = "time", f"time limit reached before round {out.count} was solved"
    except TooLarge as exc:
        out.stopped, out.message = "size", f"round {out.count}: {exc}"
    if not out.stopped and out.run is not None and stopped_early(out.run.model_status):
        out.stopped, out.message = "time", out.run.message  # HiGHS's time limit, with or without an answer
    if out.stopped:
        _fall_back(problem, table, out, start, budget)
    return out


def _run_rounds(problem, formulation, table, rel, limits: tuple, out: _Rounds, start: np.ndarray) -> None:
    """The round loop of :func:`_solve_rounds`, filling ``out``; raises OutOfTime or TooLarge."""
    t0, budget, highs_options, structures = limits
    rc = rel.reduced_cost
    scale = max(abs(rel.bound), 1.0) if math.isfinite(rel.bound) else 1.0
    slots = formulation.slots(problem)
    slots_restricted = slots and not problem.interference_avoidance
    offered, t1 = out.offered, t0
    while True:
        budget.check()
        out.count += 1
        excluded_rc = float(np.min(rc[~offered], initial=math.inf))
        graph = packing_graph(problem, table, offered, excluded_rc, slots, budget)
        columns = _columns(problem, table, graph)
        if columns > budget.max_columns:
            raise TooLarge(f"model over MAX_COLUMNS = {budget.max_columns} columns ({columns})")
        budget.check(columns * MODEL_SECONDS_PER_COLUMN)
        form, _ = compiled_model(problem, table, graph, structures)
        budget.check()
        small = problem.typed and columns <= SMALL_TYPED_COLUMNS
        warm = None if problem.typed else functools.partial(warm_start_values, problem, table, graph, start)
        t2 = time.perf_counter()
        remaining = None if budget.deadline is None else max(budget.deadline - t2, MIN_TIME_LIMIT)
        run = run_highs(
            form,
            warm,
            time_limit=remaining,
            dive=formulation.dive,
            dive_gap=TYPED_DIVE_GAP if problem.typed else None,
            pack_choices=functools.partial(pack_choices, problem, table, graph) if problem.typed else False,
            repair=functools.partial(repair_choices, problem, table, graph) if problem.typed else None,
            options=SMALL_TYPED_OPTIONS if small else None,
            **highs_options,
        )
        if budget.deadline is not None:  # HiGHS's presolve and root node do not always read the clock
            out.highs_overrun += max(0.0, time.perf_counter() - max(budget.deadline, t2))
        placement, job_x = _feasible_placement(problem, table, graph, run)
        if placement is not None:
            value = _utility_of(problem, job_x, table)
            if value > out.best_value:
                out.best, out.best_value, out.best_values = placement, value, job_x
        t3 = time.perf_counter()
        out.build_seconds += t2 - t1
        out.solve_seconds += t3 - t2  # HiGHS and decoding its answer
        if placement is None and stopped_early(run.model_status):
            out.run = run
            raise OutOfTime  # the answer is then the best of the earlier rounds and the warm start
        # Every placement worth more than rel.bound - excluded_rc uses offered options only,
        # so the model's bound holds for the problem unless the slots are a restriction.
        model_bound = run.bound if math.isfinite(run.bound) and not slots_restricted else rel.bound
        out.bound = min(rel.bound, max(model_bound, rel.bound - excluded_rc, out.best_value))
        out.certified = (
            rel.bound - excluded_rc <= out.best_value + UTILITY_RTOL * scale and not slots_restricted
        )
        out.run, out.offered = run, offered
        if out.certified or out.best is None or stopped_early(run.model_status) or offered.all():
            return
        widened = formulation.widen(rel, offered, out.best_value)
        if widened is None or not np.any(widened & ~offered) or out.count >= MAX_ROUNDS:
            return
        offered, start = widened, out.best
        t1 = time.perf_counter()


def _columns(problem: Problem, table: OptionTable, graph: PackingGraph) -> int:
    """Columns of the model over ``graph`` (y, k, z, g, h, f), counted before it is built."""
    segments = int(graph.seg_max.sum()) if graph.slots and graph.multi_jobs.size else 0
    return int(graph.opt.size + table.keep.size + problem.num_jobs + segments + graph.state_node.size + graph.arc_tail.size)


def _fall_back(problem: Problem, table: OptionTable, out: _Rounds, start: np.ndarray, budget: Budget) -> None:
    """Complete ``out`` after the rounds were cut short: the best of the rounds, the warm start and the greedy.

    The greedy runs in what is left of the solve (the stages stop
    ``FALLBACK_RESERVE`` of the time limit early for it); the solve is
    time-limited if the rounds or the greedy were.
    """
    from ..greedy import solve_greedy  # the greedy imports nothing of the MILP

    out.timed_out = out.stopped == "time"
    candidates = [("warm start", start)]
    left = budget.remaining_final()
    if left > GREEDY_SECONDS_PER_CONFIG * problem.num_configs:  # else its set-up alone would overrun
        greedy = solve_greedy(problem, time_limit=None if math.isinf(left) else left)
        candidates.append(("greedy", greedy.placement))
        out.timed_out |= greedy.status is Status.TIME_LIMIT
    for name, placement in candidates:
        broken, job_x = violations_and_values(problem, placement)
        if broken:
            continue
        value = _utility_of(problem, job_x, table)
        if value > out.best_value:
            out.best, out.best_value, out.fallback, out.best_values = placement, value, name, job_x
    out.bound = max(out.bound, out.best_value)
    if out.fallback:
        out.message += f"; answer: {out.fallback}"
    log.info("milp: %s", out.message)


def _feasible_placement(
    problem: Problem, table: OptionTable, graph: PackingGraph, run: HighsRun
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(placement, its job values) that HiGHS's solution decodes to; (None, None) if it has none
    or it is infeasible (logged)."""
    if run.values is None:
        return None, None
    placement = run.placement if run.placement is not None else decode_placement(problem, table, graph, run.values)
    broken, job_x = violations_and_values(problem, placement)
    if broken:
        log.error("HiGHS returned a solution that decodes to an infeasible placement: %s", broken)
        return None, None
    return placement, job_x


def _status(rounds: _Rounds, rel: Relaxation, mip_gap: float) -> Status:
    """HiGHS's status of the last run, made OPTIMAL or FEASIBLE by the bound against the whole problem."""
    has_solution = rounds.best is not None
    if rounds.stopped:
        status = Status.TIME_LIMIT if rounds.timed_out else Status.FEASIBLE
    else:
        status = result_status(rounds.run.model_status, has_solution)
    scale = max(abs(rel.bound), 1.0) if math.isfinite(rel.bound) else 1.0
    slack = mip_gap * max(abs(rounds.bound), abs(rounds.best_value)) + UTILITY_RTOL * scale
    within_gap = has_solution and rounds.bound - rounds.best_value <= slack
    # HiGHS's "optimal" proves the answer only when the offer holds an optimum
    # (certified) and the run solved the model itself rather than a dive's sub-MIP.
    proven = rounds.certified and rounds.run is not None and rounds.run.proven
    if has_solution and status is Status.OPTIMAL and not within_gap and not proven:
        status = Status.FEASIBLE  # optimal among the offered options only, or a dive's answer
    elif has_solution and within_gap:
        status = Status.OPTIMAL
    return status


def _result(
    problem: Problem, formulation: Formulation, table: OptionTable, rel: Relaxation, rounds: _Rounds, status: Status
) -> Result:
    """The :class:`Result`, with objective and bound on the power-mean scale."""
    if rounds.best is not None:  # checked feasible when it was found
        placement, job_x = rounds.best, rounds.best_values
    else:
        placement = problem.current.copy()
        job_x = violations_and_values(problem, placement)[1]
    objective = power_mean(job_x, problem.weight, problem.p) if job_x is not None else float("nan")
    w_sum = table.weight_sum
    if w_sum == 0:
        bound_mean = objective  # no jobs: the empty placement is all there is
    else:
        bound_mean = table.scale.mean(rounds.bound, w_sum)
        bound_mean = max(bound_mean, objective) if math.isfinite(objective) else bound_mean
    gap = float("nan")
    if math.isfinite(bound_mean) and bound_mean != 0:
        gap = (bound_mean - objective) / abs(bound_mean)
    run = rounds.run
    stats = {
        "formulation": formulation.name,
        "rounds": rounds.count,
        "options": int(table.job.size),
        "options_offered": int(rounds.offered.sum()),
        "columns": run.columns if run else 0,
        "rows": run.rows if run else 0,
        "mip_nodes": run.mip_nodes if run else -1,
        "relaxation_bound": table.scale.mean(rel.bound, w_sum) if w_sum else 0.0,
    }
    if rounds.fallback:
        stats["fallback"] = rounds.fallback
    if rounds.highs_overrun > 0:
        stats["highs_overrun_seconds"] = rounds.highs_overrun
    return Result(
        placement=placement,
        status=status,
        objective=objective,
        bound=bound_mean,
        gap=max(gap, 0.0) if math.isfinite(gap) else gap,
        build_seconds=rounds.build_seconds,
        solve_seconds=rounds.solve_seconds,
        solver="milp",
        message=rounds.message or run.message,
        stats=stats,
    )
