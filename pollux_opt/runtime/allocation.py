"""What an elastic job is asked to run on: replicas per node, optional CPU
pins, optionally a user's batch configuration, and on a cluster of several
node types the type of each node and the cgroup its replicas run in
(:class:`WorkerAllocation`), and what the supervisor does once a transition
ends (:class:`FollowUp`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from solvers import InvalidProblem

from pollux_opt.model import BatchConfig, BatchLimits
from pollux_opt.model.domains import NAME, Integer, check
from pollux_opt.agent.batch import choose_batch

__all__ = ["FollowUp", "WorkerAllocation", "normalize_placement", "parse_allocation"]

#: A CPU id a replica is pinned to, or a GPU's index.
_CPU_ID = Integer(ge=0)
#: Replicas and nodes of a placement given as counts.
_POSITIVE_COUNT = Integer(ge=1)
#: Replicas of a placement on one node (0: none there).
_REPLICAS_ON_NODE = Integer(ge=0)


@dataclass(frozen=True)
class WorkerAllocation:
    """The workers a job is asked to run on.

    Attributes:
        placement: ``{node: replicas}`` (string node keys, no zero entries).
        cpus: CPU ids to pin the replicas to, one per replica in rank order, or None.
        pin: the batch configuration a user chose to run, exactly, until the
            next allocation (e.g. to profile it; None: the job chooses its own,
            see :func:`~pollux_opt.agent.batch.choose_batch`).
        node_types: ``{node: node type}`` of every node of ``placement`` (None:
            an untyped cluster).  The job's step times go to the type it runs
            on (see :mod:`~pollux_opt.runtime.status`).
        cgroups: ``{node: cgroup directory}`` of every node of ``placement``:
            each replica moves itself into its node's cgroup before it trains
            (a throttled node's CPU quota, or the root cgroup of an unthrottled
            node; see :mod:`pollux_opt.backends.local.throttle`); None: replicas
            stay where they are.
        gpus: the GPU of each replica in rank order (None for a replica on CPU
            cores), as torch numbers the machine's GPUs
            (:mod:`~pollux_opt.runtime.device`); None: every replica on CPU cores.
    """

    placement: Mapping[str, int]
    cpus: tuple[int, ...] | None = None
    pin: BatchConfig | None = None
    node_types: Mapping[str, str] | None = None
    cgroups: Mapping[str, str] | None = None
    gpus: tuple[int | None, ...] | None = None

    @property
    def num_replicas(self) -> int:
        return sum(self.placement.values())

    @property
    def num_nodes(self) -> int:
        return len(self.placement)

    @property
    def node_type(self) -> str | None:
        """The one node type of the placement (None: untyped, or over several types)."""
        types = set((self.node_types or {}).values())
        return types.pop() if len(types) == 1 else None

    def rank_nodes(self) -> list[str]:
        """The node of each rank: ranks fill the placement's nodes in order."""
        return [nid for nid, k in self.placement.items() for _ in range(k)]

    def same_workers(self, other: "WorkerAllocation | None") -> bool:
        """Whether ``other`` asks for the same placement, CPUs, GPUs, types and cgroups (whatever its batch)."""
        return (other is not None and self.placement == other.placement and self.cpus == other.cpus
                and self.node_types == other.node_types and self.cgroups == other.cgroups
                and self.gpus == other.gpus)

    def rank_gpus(self) -> list[int | None]:
        """The GPU of each rank (None: on CPU cores)."""
        return list(self.gpus) if self.gpus is not None else [None] * self.num_replicas


def normalize_placement(
    replicas: int | Mapping[Any, int], num_nodes: int | None = None
) -> dict[str, int]:
    """``{node: replicas}`` from a replica count (spread over ``num_nodes`` logical
    nodes, as evenly as possible) or from a mapping (zero entries dropped).

    Node keys become strings (JSON-safe).  Raises InvalidProblem on bad input,
    naming the argument.
    """
    if isinstance(replicas, Mapping):
        placement = {}
        for node, count in replicas.items():
            count = check(f"placement[{node!r}]", count, _REPLICAS_ON_NODE)
            if count:
                placement[str(node)] = count
        if not placement:
            raise InvalidProblem(f"placement must give at least one replica, got {dict(replicas)!r}")
        if num_nodes is not None and num_nodes != len(placement):
            raise InvalidProblem(
                f"num_nodes ({num_nodes!r}) disagrees with the placement {placement!r} "
                f"({len(placement)} nodes); leave num_nodes out when giving a placement"
            )
        return placement
    total = check("num_replicas", replicas, _POSITIVE_COUNT)
    nodes = 1 if num_nodes is None else check("num_nodes", num_nodes, _POSITIVE_COUNT)
    if nodes > total:
        raise InvalidProblem(f"num_nodes must be <= num_replicas ({total}), got {nodes}")
    base, extra = divmod(total, nodes)
    return {str(n): base + (1 if n < extra else 0) for n in range(nodes)}


def _per_node(what: str, value: Mapping[str, str] | None, placement: Mapping[str, int],
              check_value) -> dict[str, str] | None:
    """``value`` checked to name exactly the nodes of ``placement``, keys as strings."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidProblem(f"{what} must map each node of the placement to a string, got {value!r}")
    out = {str(k): v for k, v in value.items()}
    if set(out) != set(placement):
        raise InvalidProblem(f"{what} must name exactly the placement's nodes {sorted(placement)}, got {sorted(out)}")
    return {nid: check_value(f"{what}[{nid!r}]", out[nid]) for nid in placement}


def _cgroup_dir(what: str, value) -> str:
    if not isinstance(value, str) or not value.startswith("/"):
        raise InvalidProblem(f"{what} must be an absolute cgroup directory, got {value!r}")
    return value


def parse_allocation(
    limits: BatchLimits,
    fixed_batch_size: int | None,
    replicas: int | Mapping[Any, int],
    num_nodes: int | None,
    cpus: Sequence[int] | None,
    local_bsz: int | None,
    accum_steps: int | None,
    node_types: Mapping[str, str] | None = None,
    cgroups: Mapping[str, str] | None = None,
    gpus: Sequence[int | None] | None = None,
) -> WorkerAllocation:
    """The allocation of :meth:`ElasticJob.start` / ``rescale`` arguments, checked
    against the job's batch ``limits``; raises InvalidProblem naming a bad argument."""
    placement = normalize_placement(replicas, num_nodes)
    extra = {"node_types": _per_node("node_types", node_types, placement, lambda w, v: check(w, v, NAME)),
             "cgroups": _per_node("cgroups", cgroups, placement, _cgroup_dir)}
    k = sum(placement.values())
    if cpus is not None:
        cpus = tuple(cpus)
        if len(cpus) != k or not all(_CPU_ID.accepts(c) for c in cpus):
            raise InvalidProblem(f"cpus must list one CPU id >= 0 per replica ({k}), got {cpus!r}")
        cpus = tuple(int(c) for c in cpus)
    if gpus is not None:
        gpus = tuple(gpus)
        if len(gpus) != k or not all(g is None or _CPU_ID.accepts(g) for g in gpus):
            raise InvalidProblem(f"gpus must list one GPU index >= 0 (or None: CPU cores) per replica ({k}), "
                                 f"got {gpus!r}")
        gpus = None if all(g is None for g in gpus) else tuple(None if g is None else int(g) for g in gpus)
    extra["gpus"] = gpus
    if local_bsz is None and accum_steps is None:
        choose_batch(limits, len(placement), k, None, fixed_batch_size=fixed_batch_size)  # raises if none fits
        return WorkerAllocation(placement, cpus, None, **extra)
    m = limits.min_local_bsz if local_bsz is None else local_bsz
    s = 0 if accum_steps is None else accum_steps
    m = check("local_bsz", m, Integer(ge=limits.min_local_bsz, le=limits.max_local_bsz))
    s = check("accum_steps", s, Integer(ge=0, le=limits.max_accum_steps))
    return WorkerAllocation(placement, cpus, BatchConfig(m, s), **extra)


@dataclass(frozen=True)
class FollowUp:
    """What the supervisor does once the current transition (forming, pausing
    or verifying) ends: launch ``alloc``, or stop when ``alloc`` is None (and
    end the job as ``cancelled`` when ``cancel``).

    ``t0`` is when the oldest request it serves was made (``time.monotonic``
    seconds): a rescale time counts from then.
    """

    alloc: WorkerAllocation | None
    t0: float
    cancel: bool = False

    @property
    def stop(self) -> bool:
        return self.alloc is None
