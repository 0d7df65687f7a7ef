"""Error types shared by every solver and by the domain layer."""

from __future__ import annotations

__all__ = ["InvalidProblem", "OutOfTime"]


class InvalidProblem(ValueError):
    """Bad input: the message names the offending field and its value.

    Raised before any solver runs, so a user never sees a solver trace for
    input that could have been rejected up front.  ``pollux_opt.InvalidProblem``
    is this same class.
    """


class OutOfTime(InvalidProblem):
    """A step passed its deadline before it had an answer.

    Reading or encoding an instance (the whole time limit spent before a
    solver could run), or a stage of the MILP, which then answers with the
    best feasible placement it has (:mod:`solvers.milp.budget`).
    """
