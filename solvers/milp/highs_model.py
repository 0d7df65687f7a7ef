"""One HiGHS instance holding one compiled model (:class:`HighsModel`): its runs, whole or with some choices fixed.

HiGHS prints a start-up banner from C++ on the process's first instance; it is
kept off stdout here (:func:`new_highs`).  The runs with some choices fixed
follow a fractional LP relaxation in :func:`solvers.milp.highs.run_highs`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .compiled import VARIABLES, CompiledModel

__all__ = [
    "INTEGRALITY_TOL",
    "MIN_TIME_LIMIT",
    "OBJECTIVE_RTOL",
    "PRIMAL_FEASIBLE",
    "TYPED_DIVE_GAP",
    "HighsModel",
    "HighsRun",
    "new_highs",
    "primal_matches_objective",
    "silence_banner",
]

#: Shortest time limit handed to HiGHS (it rejects 0) when the budget is spent building.
MIN_TIME_LIMIT = 1e-3

#: HiGHS ``primal_solution_status`` value of a feasible primal solution (kSolutionStatusFeasible).
PRIMAL_FEASIBLE = 2

#: Relative tolerance when checking HiGHS's primal against its reported objective.
OBJECTIVE_RTOL = 1e-6

#: A relaxed LP solution counts as integral when every integer column is this
#: close to an integer (HiGHS's own MIP feasibility tolerance is 1e-6).
INTEGRALITY_TOL = 1e-7

#: A typed round's LP dive (the large formulation) is kept only within this
#: fraction of the LP bound (utility-sum scale); else the full MIP runs.  On
#: 2048 GPUs of three types with 1000 jobs (seeds 0 to 4), the dives that
#: left room for every job came within 3e-4, those that left a job nothing
#: 0.75 short, and their greedy repairs (:meth:`HighsModel._repaired_dive`) within 9.2e-4.
TYPED_DIVE_GAP = 1e-3

#: The model's choice variables: whole options, kept jobs, job sizes, segments (the rest is the packing).
_CHOICES = ("y", "k", "z", "g")


def primal_matches_objective(h, c: np.ndarray, offset: float, info) -> bool:
    """True when ``c @ x + offset`` of HiGHS's primal equals its reported objective."""
    x = np.asarray(h.getSolution().col_value)
    value = float(c @ x + offset)
    reported = float(info.objective_function_value)
    return abs(value - reported) <= OBJECTIVE_RTOL * max(1.0, abs(reported))


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


class HighsModel:
    """One ``highspy.Highs`` holding one compiled model (as its LP relaxation at first) and the deadline.

    Besides whole runs (:meth:`run`), it runs the MIP with some choices fixed
    after a fractional LP relaxation: the packing of the LP's integral
    choices (:meth:`pack_lp_choices`) and the LP dive (:meth:`dive`, and its
    repair).  Each fixes some choice columns to the LP's values, solves the
    MIP that is left, and keeps its answer if it is good enough, else restores
    the bounds (:meth:`_fixed_run`, :meth:`_restore`).
    """

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

    def _fixed_run(self, cols: np.ndarray, values: np.ndarray):
        """Run the MIP with columns ``cols`` (int32) fixed to ``values``; HiGHS's info after the run."""
        self.h.changeColsBounds(cols.size, cols, values, values)
        self.run()
        return self.h.getInfo()

    def _restore(self, cols: np.ndarray) -> None:
        """Give columns ``cols`` their model bounds back and drop the fixed run's solver state."""
        form = self.form
        self.h.changeColsBounds(cols.size, cols, form.col_lo[cols], form.col_up[cols])
        self.h.clearSolver()

    def pack_lp_choices(
        self, x: np.ndarray, lp_bound: float, packer: Callable[[dict], np.ndarray | None] | None = None
    ) -> HighsRun | None:
        """The MIP's optimum when the LP optimum ``x`` chose integrally and only its packing is fractional.

        When every choice column (``y``, ``k``, ``z``, ``g``) of ``x`` is integral,
        any integral packing of those choices is worth the LP optimum, an upper
        bound on the MIP.  ``packer`` (choices by variable name -> a placement
        realising them, or None; :func:`solvers.milp.greedy_pack.pack_choices`)
        is tried first; if it finds none, fixing the choices leaves a packing
        feasibility MIP, far quicker than the full one, whose answer, when it
        reaches the LP bound, is a proven optimum.  None (bounds restored)
        when the choices are fractional, cannot be packed, or fall short of
        the bound.
        """
        import highspy

        index, form = self.index, self.form
        choice = np.concatenate([index[name] for name in _CHOICES])
        choice = choice[choice >= 0].astype(np.int32)
        values = np.rint(x[choice])
        if choice.size == 0 or np.any(np.abs(x[choice] - values) > INTEGRALITY_TOL):
            return None
        optimal = highspy.HighsModelStatus.kOptimal
        if packer is not None:
            rounded = x.copy()
            rounded[self.ints] = np.rint(x[self.ints])
            chosen = self.values_of(rounded)
            placement = packer(chosen)
            if placement is not None:
                message = "LP choices integral; packed greedily"
                return self.outcome(chosen, optimal, lp_bound, message, -1, placement=placement)
        info = self._fixed_run(choice, values)
        reached = float(info.objective_function_value) >= lp_bound - OBJECTIVE_RTOL * max(1.0, abs(lp_bound))
        matches = primal_matches_objective(self.h, form.c, form.offset, info)
        if info.primal_solution_status == PRIMAL_FEASIBLE and reached and matches:
            return self.outcome(
                self.values_of(self.rounded_solution()),
                optimal,
                lp_bound,
                "LP choices integral; their packing solved as a MIP",
                int(info.mip_node_count),
            )
        self._restore(choice)
        return None

    def dive(
        self,
        x: np.ndarray,
        lp_bound: float,
        accept_gap: float | None = None,
        repair: Callable[[dict], tuple | None] | None = None,
    ) -> HighsRun | None:
        """MIP with every choice the LP optimum ``x`` made whole fixed to 1; None (bounds restored) if infeasible.

        With ``accept_gap``, also None when the dive's answer falls short of the
        LP bound by more than that fraction of ``max(1, |LP bound|)``: fixing the
        whole choices can leave the undecided jobs no room, and a job that holds
        nothing costs the power mean far more than the MIP the dive avoids.
        ``repair`` (the LP's values by name -> (placement, utility sum, settled)
        or None; :func:`solvers.milp.greedy_pack.repair_choices`) is then tried
        (:meth:`_repaired_dive`), its answer kept on the same terms.
        """
        index = self.index
        floor = -np.inf if accept_gap is None else lp_bound - accept_gap * max(1.0, abs(lp_bound))
        message = "LP dive: choices the LP made whole fixed, the rest solved as a MIP"
        dived = self._fixed_dive(x, np.concatenate([index["y"], index["k"]]), lp_bound, floor, message)
        if dived is not None or repair is None:
            return dived
        repaired = repair(self.values_of(x))
        return None if repaired is None else self._repaired_dive(x, lp_bound, floor, repaired)

    def _fixed_dive(self, x: np.ndarray, choice: np.ndarray, lp_bound: float, floor: float,
                    message: str) -> HighsRun | None:
        """The MIP with the columns ``choice`` (-1: none) that the LP optimum ``x`` made whole fixed to 1:
        its answer if feasible and worth at least ``floor``, else None (bounds restored)."""
        import highspy

        choice = choice[choice >= 0]
        decided = choice[x[choice] >= 1 - INTEGRALITY_TOL].astype(np.int32)
        info = self._fixed_run(decided, np.ones(decided.size))
        if info.primal_solution_status == PRIMAL_FEASIBLE and float(info.objective_function_value) >= floor:
            return self.outcome(self.values_of(self.rounded_solution()), highspy.HighsModelStatus.kOptimal, lp_bound,
                                message, int(info.mip_node_count), proven=False)
        self._restore(decided)
        return None

    def _repaired_dive(self, x: np.ndarray, lp_bound: float, floor: float, repaired: tuple) -> HighsRun | None:
        """The dive again, fixing only the whole choices that the greedy ``repaired`` realised as the LP chose.

        ``repaired`` is (placement, its utility sum, settled: bool by name, ``y``
        and ``k``) of :func:`solvers.milp.greedy_pack.repair_choices`; that
        placement shows the fixed choices can be packed.  The better of the MIP's
        answer and the placement, if at least ``floor``; else None (bounds restored).
        """
        import highspy

        placement, value, settled = repaired
        index = self.index
        choice = np.concatenate([index["y"][settled["y"]], index["k"][settled["k"]]])
        message = "LP dive: the whole choices a greedy packing kept fixed, the rest solved as a MIP"
        dived = self._fixed_dive(x, choice, lp_bound, max(floor, value), message)
        if dived is not None or value < floor:
            return dived
        message = "LP dive: the LP's choices rounded and packed greedily"
        return self.outcome(self.values_of(x), highspy.HighsModelStatus.kOptimal, lp_bound, message, -1, proven=False,
                            placement=placement)
