"""Limits of one MILP solve: its deadline, and the largest model it builds.

Every stage of :func:`solvers.milp.solve_milp` checks the deadline between
its steps (:meth:`Budget.check`), and the packing graph and the model are
sized before they are built, so that neither a time limit nor the memory is
overrun by a model the solver could not finish anyway.  A stage that runs
out raises :class:`OutOfTime` or :class:`TooLarge`; the solve then answers
with the best feasible placement it has (see :mod:`solvers.milp.solve`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from ..errors import OutOfTime

__all__ = [
    "FALLBACK_RESERVE",
    "MAX_ARCS",
    "MAX_COLUMNS",
    "MODEL_SECONDS_PER_COLUMN",
    "Budget",
    "TooLarge",
]

#: Largest packing graph built.  The graph has about (largest useful node
#: capacity) x (distinct piece sizes) x (layers) arcs; ordinary instances have
#: dozens to a few thousand (16 x 4 CPUs: dozens; 128 x 4 with 250 jobs and no
#: interference avoidance: about 2000).  It grows with the replica counts of
#: the options, not with the node capacity (see ``packing_graph``).
MAX_ARCS = 100_000

#: Largest model (columns) built: 2048 CPUs with 1000 jobs, the largest
#: benchmark, has about 20 000; at this size the Pyomo build and compilation
#: take a few seconds and a few hundred MiB.
MAX_COLUMNS = 200_000

#: Seconds per model column of Pyomo build plus compilation, measured on the
#: project's 2-core machine under load (the 5000-column model: 0.035 s to
#: build, as much to compile), doubled: a round whose remaining time is
#: below this estimate is not started.
MODEL_SECONDS_PER_COLUMN = 3e-5


#: Share of a time limit kept back from the MILP's stages for the fallback:
#: when the rounds run out of time, the greedy (milliseconds on most
#: instances) gets this last part to improve on the best placement found.
FALLBACK_RESERVE = 0.1

#: Seconds per configuration of what a solve does after the greedy when its
#: stages ran out of time (checking and scoring the candidate placements,
#: the result's objective): 1.3 s for 600,000 configurations (a 200,000-job
#: instance) on the project's 2-core machine at load 2, rounded up.  Kept
#: back from the time limit, so that the whole solve ends within it.
FINISH_SECONDS_PER_CONFIG = 3e-6
#: Most of a time limit kept back for that finish (the rest goes to the stages and the greedy).
MAX_FINISH_SHARE = 0.5


class TooLarge(Exception):
    """A packing graph or model would exceed ``MAX_ARCS`` or ``MAX_COLUMNS``."""


@dataclass(frozen=True)
class Budget:
    """A solve's deadlines (``time.perf_counter()`` seconds, None: no limit) and size limits.

    ``deadline`` ends the MILP's stages; ``final`` (after the fallback
    reserve) ends the fallback greedy, the finish after it kept back.
    """

    deadline: float | None = None
    final: float | None = None
    max_arcs: int = MAX_ARCS
    max_columns: int = MAX_COLUMNS

    @staticmethod
    def starting_now(time_limit: float | None, configs: int = 0) -> "Budget":
        """The budget of a solve of ``configs`` configurations with ``time_limit``
        seconds (None: no limit) from now: ``final`` leaves the finish
        (:data:`FINISH_SECONDS_PER_CONFIG`) of the time limit, ``deadline`` the
        fallback reserve of what is left before it."""
        if time_limit is None:
            return Budget()
        now = time.perf_counter()
        usable = time_limit - min(FINISH_SECONDS_PER_CONFIG * configs, MAX_FINISH_SHARE * time_limit)
        return Budget(now + (1 - FALLBACK_RESERVE) * usable, now + usable)

    def remaining(self) -> float:
        """Seconds left to the stages (inf without a deadline; may be negative)."""
        return math.inf if self.deadline is None else self.deadline - time.perf_counter()

    def remaining_final(self) -> float:
        """Seconds left to the end of the solve (inf without a deadline; may be negative)."""
        return math.inf if self.final is None else self.final - time.perf_counter()

    def check(self, seconds_needed: float = 0.0) -> None:
        """Raise :class:`OutOfTime` unless more than ``seconds_needed`` seconds are left."""
        if self.deadline is not None and self.remaining() <= seconds_needed:
            raise OutOfTime
