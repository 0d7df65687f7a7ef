"""The messages between a job's supervisor and its workers: the one module both sides import.

A message is a tuple whose first item is its kind.  Commands, supervisor -> worker:

* ``(RUN, Assignment)``: serve one generation of a job (an idle worker);
* ``(STOP,)``, to rank 0 while it trains: finish the step, checkpoint, pause;
* ``(BATCH, local_bsz, accum_steps, params)``, to rank 0 while it trains:
  train with that batch from the next step on; ``params`` (a dict, or None)
  is the fitted throughput model rank 0 stores in its checkpoints;
* ``(PREPARE, job_id, spec_json, workdir)``, to an idle worker: build the
  job's parts ahead of an assignment;
* ``(EXIT,)``, to an idle worker: end.

Reports, worker -> supervisor, are ``(kind, info)``, ``info`` a dict carrying
``generation`` and ``rank``: ``RESUMED`` (the rank joined its generation and
loaded its state), ``METRICS`` (rank 0: position, measurements, step rows),
``CHECKPOINT`` (rank 0 wrote one), ``PAUSED`` (the rank left its generation;
``reason``: one of :data:`STOP_REASONS`), ``ERROR`` (the assignment failed:
``error``, ``traceback``, and ``collective``, true where only a collective
failed, a symptom of a lost peer).

Before each step rank 0 broadcasts ``[stop_code, local_bsz, accum_steps]`` to
the other ranks (the stop codes below), so that every rank stops, or changes
its batch, at the same step boundary; a rank whose collective fails reports
an ``ERROR`` with ``collective`` true (:class:`CollectiveError`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pollux_opt.runtime.report import RuntimeOptions

__all__ = ["BATCH", "CHECKPOINT", "CONTINUE", "ERROR", "EXIT", "METRICS", "PAUSED", "PREPARE",
           "RESUMED", "RUN", "STOP", "STOP_LIMIT", "STOP_PARENT", "STOP_REASONS", "STOP_REQUEST", "STOP_TARGET",
           "TCP_STORE_PREFIX", "Assignment", "CollectiveError", "StopTraining", "collective", "send"]

RUN, STOP, BATCH, PREPARE, EXIT = "run", "stop", "batch", "prepare", "exit"
RESUMED, METRICS, CHECKPOINT, PAUSED, ERROR = "resumed", "metrics", "checkpoint", "paused", "error"
#: Stop codes rank 0 broadcasts before each step.
CONTINUE, STOP_REQUEST, STOP_TARGET, STOP_LIMIT, STOP_PARENT = 0, 1, 2, 3, 4
#: A ``PAUSED`` report's ``reason``, by stop code.
STOP_REASONS = {STOP_REQUEST: "request", STOP_TARGET: "target", STOP_LIMIT: "step_limit", STOP_PARENT: "parent_lost"}
#: Prefix of an :class:`Assignment`'s ``store_path`` that names a TCP store
#: (``tcp://host:port``) rather than a FileStore file.
TCP_STORE_PREFIX = "tcp://"


@dataclass(frozen=True)
class Assignment:
    """One generation of a job on one worker (picklable)."""

    job_id: str
    spec_json: str
    workdir: str
    generation: int
    rank: int
    world: int
    num_nodes: int
    store_path: str | None
    checkpoint_meta: str | None
    local_bsz: int
    accum_steps: int
    options: RuntimeOptions
    params: dict | None = None
    cpu: int | None = None
    #: The node type this generation runs on (None: untyped, or over several types).
    node_type: str | None = None
    #: The cgroup directory this worker moves itself into before it trains (None: stay).
    cgroup: str | None = None
    #: The GPU of a GPU replica, as torch numbers the GPUs its process sees before
    #: it is bound (:class:`~pollux_opt.runtime.device.GpuBinding`; a Ray actor sees
    #: only its own, 0); None: a CPU replica.
    gpu: int | None = None
    #: The process group's backend: "nccl" where every replica has a GPU, else "gloo".
    backend: str = "gloo"
    #: The job's replicas are on GPUs and CPU cores at once, or on GPUs of several
    #: node types (their parameters are re-synchronised now and then: the devices
    #: may round differently).
    mixed: bool = False


def send(conn, *message) -> bool:
    """Send ``message`` over ``conn`` (either side's end); False where the other side is gone."""
    try:
        conn.send(message)
        return True
    except (BrokenPipeError, EOFError, OSError):
        return False


class CollectiveError(RuntimeError):
    """A collective operation failed: a peer died or the group broke.  Reported
    as a symptom (``collective: True``), so that a killed peer leads to a
    restart rather than to failing the job."""


def collective(fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, a collective; its failure raised as a :class:`CollectiveError`."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - re-raised with its cause
        raise CollectiveError(f"{getattr(fn, '__name__', fn)}: {exc}") from exc


class StopTraining(Exception):
    """Rank 0's stop code said stop, at a step boundary (``code``: the stop code)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code
