"""Error types shared by every solver and by the domain layer."""

from __future__ import annotations

__all__ = ["InvalidProblem"]


class InvalidProblem(ValueError):
    """Bad input: the message names the offending field and its value.

    Raised before any solver runs, so a user never sees a solver trace for
    input that could have been rejected up front.  ``pollux_opt.InvalidProblem``
    is this same class.
    """
