"""Rank 0's control of a job's steps: the control vector it broadcasts before
each step (:class:`StepControl`), the stop codes, and collective failures.

Before each step rank 0 reads the controller's commands (stop, a batch
change) and broadcasts ``[stop_code, local_bsz, accum_steps]``, so that every
rank stops, or changes its batch, at the same step boundary (see
:mod:`~pollux_opt.runtime.trainer`).
"""

from __future__ import annotations

__all__ = ["CONTINUE", "STOP_LIMIT", "STOP_PARENT", "STOP_REASONS", "STOP_REQUEST", "STOP_TARGET",
           "CollectiveError", "StepControl", "StopTraining", "collective"]

#: Control codes broadcast by rank 0 before each step.
CONTINUE, STOP_REQUEST, STOP_TARGET, STOP_LIMIT, STOP_PARENT = 0, 1, 2, 3, 4
STOP_REASONS = {STOP_REQUEST: "request", STOP_TARGET: "target", STOP_LIMIT: "step_limit", STOP_PARENT: "parent_lost"}


class StepControl:
    """The control half of :class:`~pollux_opt.runtime.trainer.Trainer` (a mixin
    using its ``conn``, ``state``, ``a``, ``rank``, ``world``, ``ctrl``,
    ``pending_config``, ``stop_requested``, ``parent_lost``, ``dist``)."""

    def _read_commands(self) -> None:
        conn = self.conn
        try:
            while conn.poll():
                msg = conn.recv()
                if msg[0] == "stop":
                    self.stop_requested = True
                elif msg[0] == "batch":
                    self.pending_config = (int(msg[1]), int(msg[2]))
                    if msg[3] is not None:
                        self.state.params = msg[3]
        except (EOFError, OSError):
            self.parent_lost = True

    def _decide(self) -> int:
        if self.rank == 0:
            self._read_commands()
            if self.parent_lost:
                code = STOP_PARENT
            elif self.state.target_reached:
                code = STOP_TARGET
            elif self.stop_requested:
                code = STOP_REQUEST
            elif self.a.options.step_limit is not None and self.state.step >= self.a.options.step_limit:
                code = STOP_LIMIT
            else:
                code = CONTINUE
            self.ctrl[0], self.ctrl[1], self.ctrl[2] = code, self.pending_config[0], self.pending_config[1]
        if self.world > 1:
            collective(self.dist.broadcast, self.ctrl, src=0)
        return int(self.ctrl[0])


class CollectiveError(RuntimeError):
    """A collective operation failed: a peer died or the group broke.

    Reported to the controller as a symptom (``collective: True``), not as an
    error of the job's code, so that a killed peer leads to a restart rather
    than to failing the job.
    """


def collective(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - re-raised with its cause
        raise CollectiveError(f"{getattr(fn, '__name__', fn)}: {exc}") from exc


class StopTraining(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code
