"""Stage 5 of the MILP: the HiGHS adapter (highspy), from a compiled model to rounded variable values.

:func:`run_highs` solves the LP relaxation first and runs the MIP only if it
is fractional (optionally after an LP-guided dive), warm-started from a
placement.  HiGHS model statuses map to :class:`solvers.Status` through the
table :data:`HIGHS_STATUS` (as scipy's ``milp`` maps them to its own codes).
Two HiGHS behaviours are worked around here: its start-up banner, printed
from C++ on the process's first instance (:func:`new_highs`), and HiGHS
1.16 sometimes returning the warm start as its primal together with the
optimum's objective (detected and re-solved cold, :func:`_solve_mip`).
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..result import Status
from .compiled import VARIABLES, CompiledModel
from .fixing import INTEGRALITY_TOL as _INTEGRALITY_TOL
from .fixing import PRIMAL_FEASIBLE as _PRIMAL_FEASIBLE
from .fixing import dive as _dive
from .fixing import pack_lp_choices as _pack_lp_choices
from .fixing import primal_matches_objective as _primal_matches_objective

__all__ = [
    "HIGHS_STATUS",
    "MIN_TIME_LIMIT",
    "SMALL_TYPED_OPTIONS",
    "HighsRun",
    "load_status_table",
    "new_highs",
    "result_status",
    "run_highs",
    "silence_banner",
    "stopped_early",
]

log = logging.getLogger(__name__)

#: Row activity tolerance when accepting a rounded LP solution (HiGHS's primal feasibility tolerance).
_ROW_TOL = 1e-7

#: HiGHS options for a small typed model (a few hundred columns, its MIP run
#: without a warm start): presolve took a third of its LP relaxation, and
#: presolve with the feasibility-jump heuristic more than half of its MIP,
#: whose root node usually closes it.
SMALL_TYPED_OPTIONS = {"presolve": "off", "mip_heuristic_run_feasibility_jump": False}

#: Shortest time limit handed to HiGHS (it rejects 0) when the budget is spent building.
MIN_TIME_LIMIT = 1e-3

#: HiGHS model status -> (status when a feasible solution exists, status when not);
#: any status not listed maps to ``Status.ERROR``.  Filled on first use (highspy import).
HIGHS_STATUS: dict = {}


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


def load_status_table() -> None:
    """Fill :data:`HIGHS_STATUS` (once)."""
    if not HIGHS_STATUS:
        HIGHS_STATUS.update(_highs_status_table())


def result_status(model_status, has_solution: bool) -> Status:
    """The :class:`Status` of a HiGHS model status, by :data:`HIGHS_STATUS`."""
    load_status_table()
    return HIGHS_STATUS.get(model_status, (Status.ERROR, Status.ERROR))[0 if has_solution else 1]


def stopped_early(model_status) -> bool:
    """True when HiGHS stopped on its time limit or an interrupt."""
    import highspy

    ms = highspy.HighsModelStatus
    return model_status in (ms.kTimeLimit, ms.kInterrupt)


@functools.cache
def silence_banner() -> None:
    """Create the process's first ``highspy.Highs`` with stdout captured (once; see :func:`new_highs`).

    HiGHS prints its banner from C++ when the first instance of a process is
    created; it would corrupt the JSON that ``pollux-opt allocate`` writes to
    stdout.  Capturing the file descriptor costs milliseconds, so it is done once.
    """
    import highspy
    from pyomo.common.tee import capture_output

    with capture_output(capture_fd=True):
        highspy.Highs()


def new_highs():
    """A fresh ``highspy.Highs`` (the start-up banner kept off stdout)."""
    import highspy

    silence_banner()
    return highspy.Highs()


@dataclass
class HighsRun:
    """Outcome of one HiGHS run on one model."""

    values: dict | None  # rounded variable values by name, None without a solution
    model_status: object  # highspy.HighsModelStatus
    bound: float  # dual bound on the model's utility sum (nan if none)
    message: str
    mip_nodes: int  # -1 when the LP relaxation was already integral
    columns: int
    rows: int
    #: False when ``values`` are a heuristic's answer (the LP dive): HiGHS's
    #: "optimal" is then the fixed sub-MIP's, not the model's.
    proven: bool = True
    #: int64[J, N] the answer as a placement when it was packed without the
    #: packing variables (``values`` then hold the choices only), else None.
    placement: np.ndarray | None = None


class _HighsCall:
    """One ``highspy.Highs`` holding one compiled model (as its LP relaxation at first) and the deadline."""

    def __init__(self, form: CompiledModel, *, time_limit, mip_gap, threads, verbose, seed) -> None:
        import highspy

        self.form = form
        self.index = form.index  # variable name -> column of each of its entries, -1 if compiled away
        self.ints = np.flatnonzero(form.integrality)
        self.deadline = None if time_limit is None else time.perf_counter() + time_limit
        h = self.h = new_highs()
        h.setOptionValue("output_flag", bool(verbose))
        h.setOptionValue("mip_rel_gap", float(mip_gap))
        if threads is not None:
            # HiGHS sizes one process-wide thread pool at its first run and fails
            # ("Not Set") when a later run asks for another size; reset it first.
            highspy.Highs.resetGlobalScheduler(True)
            h.setOptionValue("threads", int(threads))
        if seed is not None:
            h.setOptionValue("random_seed", int(seed))
        A = form.A
        h.passModel(
            form.num_columns,
            A.shape[0],
            A.nnz,
            int(highspy.MatrixFormat.kRowwise),
            int(highspy.ObjSense.kMaximize),
            form.offset,
            form.c,
            form.col_lo,
            form.col_up,
            form.row_lo,
            form.row_up,
            A.indptr.astype(np.int32, copy=False),
            A.indices.astype(np.int32, copy=False),
            A.data.astype(np.float64, copy=False),
            np.zeros_like(form.integrality),  # the LP relaxation first
        )

    def run(self) -> None:
        """Run HiGHS on what remains of the time budget."""
        if self.deadline is not None:
            self.h.setOptionValue("time_limit", max(self.deadline - time.perf_counter(), MIN_TIME_LIMIT))
        self.h.run()

    def out_of_time(self) -> bool:
        """True once the deadline has passed (HiGHS's set-up overruns even a tiny limit, so no run starts then)."""
        return self.deadline is not None and time.perf_counter() >= self.deadline

    def timed_out(self, stage: str) -> HighsRun:
        """The outcome of a run cut short by the deadline after ``stage``, without a solution."""
        import highspy

        return self.outcome(None, highspy.HighsModelStatus.kTimeLimit, float("nan"), f"time limit reached after {stage}", -1)

    def values_of(self, x: np.ndarray) -> dict:
        """Variable values by name (``g`` as a dict keyed like ``model.g``) of a column vector."""
        index = self.index
        out = {name: np.where(index[name] >= 0, x[np.maximum(index[name], 0)], 0.0) for name in VARIABLES}
        out["g"] = dict(zip(self.form.g_keys, out["g"].tolist()))
        return out

    def rounded_solution(self) -> np.ndarray:
        """HiGHS's primal with the integer columns rounded."""
        x = np.asarray(self.h.getSolution().col_value)
        x[self.ints] = np.rint(x[self.ints])
        return x

    def outcome(self, values, model_status, bound: float, message: str, mip_nodes: int, **extra) -> HighsRun:
        return HighsRun(
            values=values,
            model_status=model_status,
            bound=bound,
            message=message,
            mip_nodes=mip_nodes,
            columns=self.form.num_columns,
            rows=self.form.num_rows,
            **extra,
        )


def run_highs(
    form: CompiledModel,
    start: dict | Callable[[], dict] | None,
    *,
    time_limit,
    mip_gap,
    threads,
    verbose,
    seed,
    dive=False,
    dive_gap=None,
    pack_choices=False,
    repair=None,
    options=None,
) -> HighsRun:
    """Solve the compiled model ``form``: its LP relaxation, then the MIP if that is fractional.

    An integral optimum of the LP relaxation is an optimum of the MIP, and on
    most small instances here the arc-flow relaxation is integral
    (docs/formulation.md), so this skips HiGHS's MIP set-up (presolve,
    probing, heuristics), which costs several times the LP itself.

    With ``dive`` (the restricted formulation), a fractional LP is followed
    by a MIP in which every choice the LP made whole (y or k at 1) is fixed;
    only the undecided jobs and the packing stay free.  That MIP is small and
    fast; its answer is feasible but not proven optimal, so the bound
    returned is the LP optimum.  If it finds nothing (or, with ``dive_gap``,
    nothing within that fraction of the LP bound), the full MIP runs.

    With ``pack_choices`` (typed problems, whose LP optimum often chooses
    integrally and packs fractionally), a fractional LP is first followed by
    the packing of its choices (:func:`~solvers.milp.fixing.pack_lp_choices`;
    a callable ``pack_choices`` is its greedy packer), a proven optimum
    when it succeeds.

    ``repair`` (the LP's values by name -> (placement, utility sum) or
    None) follows a dive that found nothing good enough (see
    :func:`~solvers.milp.fixing.dive`).

    ``options`` (HiGHS option name -> value, e.g. :data:`SMALL_TYPED_OPTIONS`)
    are set for every stage.

    Args:
        start: warm-start values by variable name
            (:func:`solvers.milp.warmstart.warm_start_values`), a function
            returning them (called only when the MIP runs), or None.
        time_limit: seconds for all HiGHS runs together (None: no limit).
        mip_gap, threads, verbose, seed: HiGHS's ``mip_rel_gap``, ``threads``,
            ``output_flag`` and ``random_seed`` (None: HiGHS default).
    """
    import highspy

    call = _HighsCall(form, time_limit=time_limit, mip_gap=mip_gap, threads=threads, verbose=verbose, seed=seed)
    for name, value in (options or {}).items():
        call.h.setOptionValue(name, value)
    call.run()
    lp_optimal = call.h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    if lp_optimal:
        lp_bound = float(call.h.getInfo().objective_function_value)
        x = np.asarray(call.h.getSolution().col_value)
        integral = _integral_lp_solution(call, x, lp_bound)
        if integral is not None:
            return integral

    if call.out_of_time():
        return call.timed_out("the LP relaxation")
    ints = call.ints
    call.h.changeColsIntegrality(ints.size, ints.astype(np.int32), np.ones(ints.size, dtype=np.uint8))
    if pack_choices and lp_optimal:
        packed = _pack_lp_choices(call, x, lp_bound, pack_choices if callable(pack_choices) else None)
        if packed is not None:
            return packed
        if call.out_of_time():
            return call.timed_out("the packing of the LP's choices")
    if dive and lp_optimal:
        dived = _dive(call, x, lp_bound, dive_gap, repair)
        if dived is not None:
            return dived
        if call.out_of_time():
            return call.timed_out("the LP dive")
    if callable(start):
        start = start()
    if start is not None:
        _set_warm_start(call, start)
    return _solve_mip(call)


def _integral_lp_solution(call: _HighsCall, x: np.ndarray, lp_bound: float) -> HighsRun | None:
    """The LP optimum ``x`` as the MIP's answer if it is integral (within tolerances), else None."""
    import highspy

    form, ints = call.form, call.ints
    rounded = x.copy()
    rounded[ints] = np.rint(x[ints])
    activity = form.A @ rounded
    if (
        np.all(np.abs(x[ints] - rounded[ints]) <= _INTEGRALITY_TOL)
        and np.all(activity >= form.row_lo - _ROW_TOL)
        and np.all(activity <= form.row_up + _ROW_TOL)
    ):
        return call.outcome(
            call.values_of(rounded), highspy.HighsModelStatus.kOptimal, lp_bound, "LP relaxation integral", -1
        )
    return None


def _set_warm_start(call: _HighsCall, start: dict) -> None:
    """Hand HiGHS the warm start ``start`` (values by variable name) as its starting solution."""
    import highspy

    sol = highspy.HighsSolution()
    sol.col_value = call.form.column_vector(start).tolist()
    sol.value_valid = True
    call.h.setSolution(sol)


def _solve_mip(call: _HighsCall) -> HighsRun:
    """Run the MIP and read its answer, re-solving cold if the primal does not match the objective."""
    import highspy

    h = call.h
    call.run()
    info = h.getInfo()
    has_solution = info.primal_solution_status == _PRIMAL_FEASIBLE
    if has_solution and not _primal_matches_objective(h, call.form.c, call.form.offset, info):
        # HiGHS 1.16 can report the optimum of a presolved run yet hand back the
        # user's start as its primal solution; solving again without the start
        # returns the primal that goes with the reported objective.
        log.warning("HiGHS primal does not match its objective; re-solving without the warm start")
        h.clearSolver()
        h.setSolution(highspy.HighsSolution())
        call.run()
        info = h.getInfo()
        has_solution = info.primal_solution_status == _PRIMAL_FEASIBLE
    model_status = h.getModelStatus()
    values = call.values_of(call.rounded_solution()) if has_solution else None
    bound = float(info.mip_dual_bound)
    return call.outcome(
        values,
        model_status,
        bound if math.isfinite(bound) else float("nan"),
        h.modelStatusToString(model_status),
        int(info.mip_node_count),
    )
