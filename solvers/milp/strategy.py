r"""The two formulations of the MILP, as strategy objects with one small interface.

Both solve the same arc-flow model (:mod:`solvers.milp.model`) over the
options a :class:`Formulation` *offers*, and report the true objective of
their placement against a bound that holds for the whole problem.
:func:`solvers.milp.solve.solve_milp` picks one with :func:`choose_formulation`
and calls it; ``docs/formulation.md`` has the measured costs of both.

Bound.  The aggregated relaxation (:func:`solvers.milp.bound.relax`) gives
an upper bound L on the utility sum of every feasible placement and a
reduced cost rc_o per option: a placement using o is worth at most
L - rc_o.  So a placement worth more than ``L - min rc over options left
out`` uses offered options only, and the bound reported is ``min(L,
max(bound of the model, L - min rc over options left out))``.

:class:`ExactFormulation` (``"exact"``).  Round one offers options with
rc_o <= ``FIRST_ROUND_REL`` max(|L|, W).  If the round's best placement
reaches ``L - min rc left out`` it is optimal; otherwise round two offers
every o with rc_o <= L - (round-one value), which is then exact.

:class:`RestrictedFormulation` (``"large"``) restricts the model three
ways, each keeping every answer feasible for the real problem:

1. Options: each job is offered its ``OPTIONS_PER_JOB`` options of lowest
   reduced cost (plus keeping its placement), instead of all of them.
2. Slots: at most one multi-node job per node even without interference
   avoidance, so the packing graph keeps two layers instead of one per
   multi-node job.
3. Dive: when the LP relaxation of the restricted model is fractional, every
   choice it made whole (y or k at 1) is fixed and the MIP decides only the
   rest; if that finds nothing (with node types: nothing within
   ``TYPED_DIVE_GAP`` of the LP bound, even after the greedy repair of
   :func:`~solvers.milp.greedy_pack.repair_choices`), the restricted MIP
   runs in full.

It runs one round; its status is ``Status.OPTIMAL`` only when the bound
proves the placement within ``mip_gap``, otherwise ``Status.FEASIBLE`` (or
a time-limit status).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..problem import Problem
from .bound import Relaxation
from .options import UTILITY_RTOL, OptionTable, option_table

__all__ = [
    "AUTO_LARGE_OPTIONS",
    "BY_NAME",
    "FIRST_ROUND_REL",
    "OPTIONS_PER_JOB",
    "ExactFormulation",
    "Formulation",
    "RestrictedFormulation",
    "choose_formulation",
]

#: ``formulation="auto"`` switches to the large-cluster formulation from this
#: many options (rows of the problem's :class:`~solvers.milp.options.OptionTable`,
#: the y columns of the exact model) on.  The exact model's size, and its
#: solve time, grow with its options; the cluster's size enters through the
#: options each job may take.  Measured on this project's 2-core machine with
#: random clusters of 4-CPU nodes and one job per 2 CPUs (docs/formulation.md):
#: the exact solve took 0.1 s of CPU at 256 CPUs (1850 to 2050 options), 0.4 to
#: 0.8 s at 512 (3300 to 4000) and 3.3 s at 1024 (about 8200); the large one 0.05
#: to 0.13 s, losing at most 0.06 % of the exact optimum.  The rounds of a
#: workload-6 simulation on 16 x 4 CPUs have at most about 1700 options.
AUTO_LARGE_OPTIONS = 3000

#: First round of the exact solve: options whose Lagrangian reduced cost is at
#: most this fraction of ``max(|L|, sum of weights)``.  Measured over the 18
#: anchor rounds and 24 random 16 x 4 clusters (docs/formulation.md): 0.3 %
#: needed a second round on 1 instance in 7 and gave the lowest median and
#: mean time of the rules tried; the second round is exact regardless.
FIRST_ROUND_REL = 3e-3

#: Options offered per job by the large formulation, lowest reduced cost first.
#: On random 512 x 4-CPU clusters with 1000 jobs, 3 lost at most 0.06 % against
#: the exact optimum where that could be computed (docs/formulation.md).
OPTIONS_PER_JOB = 3


class Formulation:
    """What differs between formulations: which options a model offers, and how it is solved.

    Attributes:
        name: the ``formulation`` option value (reported in ``Result.stats``).
        dive: follow a fractional LP relaxation by the LP-guided dive
            (:func:`solvers.milp.highs.run_highs`).
    """

    name: str
    dive: bool

    def slots(self, problem: Problem) -> bool:
        """Whether the packing graph allows at most one multi-node job per node."""
        raise NotImplementedError

    def offered(self, problem: Problem, table: OptionTable, relaxation: Relaxation) -> np.ndarray:
        """bool[O]: options the first round's model offers."""
        raise NotImplementedError

    def widen(self, relaxation: Relaxation, offered: np.ndarray, best_value: float) -> np.ndarray | None:
        """bool[O]: options of the next round, given the best utility sum found; None: stop."""
        raise NotImplementedError


@dataclass(frozen=True)
class ExactFormulation(Formulation):
    """Every useful option, in at most two rounds: optimal within ``mip_gap``."""

    name: str = "exact"
    dive: bool = False

    def slots(self, problem: Problem) -> bool:
        return problem.interference_avoidance

    def offered(self, problem: Problem, table: OptionTable, relaxation: Relaxation) -> np.ndarray:
        """Options with reduced cost <= ``FIRST_ROUND_REL`` max(|L|, sum of weights on the utility's scale)."""
        bound = relaxation.bound
        return relaxation.reduced_cost <= FIRST_ROUND_REL * max(abs(bound), table.weight_sum)

    def widen(self, relaxation: Relaxation, offered: np.ndarray, best_value: float) -> np.ndarray:
        """Also every option that a placement better than ``best_value`` could use."""
        scale = max(abs(relaxation.bound), 1.0)
        return offered | (relaxation.reduced_cost <= relaxation.bound - best_value + UTILITY_RTOL * scale)


@dataclass(frozen=True)
class RestrictedFormulation(Formulation):
    """Each job's few best options, one multi-node job per node, LP-guided dive: feasible, honest bound."""

    name: str = "large"
    dive: bool = True
    options_per_job: int = OPTIONS_PER_JOB

    def slots(self, problem: Problem) -> bool:
        return True

    def offered(self, problem: Problem, table: OptionTable, relaxation: Relaxation) -> np.ndarray:
        """Each job's ``options_per_job`` options of lowest reduced cost.

        Options that cannot be placed at all (infinite reduced cost) are never offered.
        """
        rc = relaxation.reduced_cost
        order = np.lexsort((rc, table.job))
        job = table.job[order]
        rank = np.arange(job.size) - np.searchsorted(job, job, side="left")
        offered = np.zeros(table.job.size, dtype=bool)
        offered[order[rank < self.options_per_job]] = True
        return offered & np.isfinite(rc)

    def widen(self, relaxation: Relaxation, offered: np.ndarray, best_value: float) -> None:
        return None  # one round: the restriction is the point


#: The formulations by ``formulation`` option value (``"auto"`` picks one of them).
BY_NAME = {f.name: f for f in (ExactFormulation(), RestrictedFormulation())}


def choose_formulation(problem: Problem, formulation: str = "auto", table: OptionTable | None = None) -> Formulation:
    """The formulation named ``formulation``; ``"auto"`` chooses by model size.

    ``"auto"`` is the large formulation when the problem has at least
    ``AUTO_LARGE_OPTIONS`` options (rows of ``table``, its
    :func:`~solvers.milp.options.option_table`, computed when None), the
    exact one below.
    """
    if formulation == "auto":
        table = option_table(problem) if table is None else table
        formulation = "large" if int(table.job.size) >= AUTO_LARGE_OPTIONS else "exact"
    return BY_NAME[formulation]
