"""The divergence rule: a job whose training loss blows up is failed, not trained on.

A non-finite loss or gradient fails the job at once (checked every step,
:meth:`~pollux_opt.runtime.trainer.Trainer.finish_step`).  At each progress
report (every ``report_interval_s``) rank 0 takes the mean training loss of the
steps since the previous report: above ``divergence_factor`` times the
*reference*, the mean of the job's first report, for ``divergence_reports``
consecutive reports, it fails the job with :class:`JobDiverged`, whose message
(in the job's error, its ``failed`` event and ``logs/worker-rank0.log``) gives
the loss, the bound and the count.  The reference and the count are
checkpointed (:class:`~pollux_opt.runtime.state.TrainingState`), so a restart
neither resets nor repeats them.  A reference that is not positive (a
log-likelihood ratio) disables the rule; a user's loop that reports no loss
(``loss.backward()`` rather than ``model.backward(loss)``) has the non-finite
gradient check only.
"""

from __future__ import annotations

import math
from typing import Iterable

__all__ = ["DEFAULT_DIVERGENCE_FACTOR", "DEFAULT_DIVERGENCE_REPORTS", "JobDiverged", "check_divergence"]

#: Multiple of the first report's loss beyond which a report counts as
#: diverging (project choice: a healthy job's loss falls from its initial
#: value; a thousandfold rise is far outside any noise, while a diverging job,
#: such as an MSE at 1e18 within minutes, passes it within seconds).
DEFAULT_DIVERGENCE_FACTOR = 1e3
#: Consecutive diverging reports that fail a job (project choice: about a
#: second at the default report interval of 0.2 s, so a single spike never does).
DEFAULT_DIVERGENCE_REPORTS = 5


class JobDiverged(RuntimeError):
    """The training loss stayed above its bound for the rule's number of reports."""


def check_divergence(state, losses: Iterable[float], factor: float | None, reports: int) -> None:
    """Apply the rule to one report's per-step mean ``losses`` (NaN: not
    reported), updating ``state.loss_ref`` and ``state.diverging_reports``;
    ``factor``: the multiple (None disables the rule), ``reports``: the
    consecutive reports above the bound that raise :class:`JobDiverged`."""
    finite = [x for x in losses if math.isfinite(x)]
    if factor is None or not finite:
        return
    mean = sum(finite) / len(finite)
    if state.loss_ref is None:
        state.loss_ref = mean
        return
    if state.loss_ref <= 0 or mean <= factor * state.loss_ref:
        state.diverging_reports = 0
        return
    state.diverging_reports += 1
    if state.diverging_reports >= reports:
        raise JobDiverged(
            f"training loss {mean:.4g} at step {state.step} exceeds {factor:g} x its initial {state.loss_ref:.4g} "
            f"for {state.diverging_reports} consecutive reports"
        )
