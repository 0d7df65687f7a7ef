"""Node types of a heterogeneous cluster: the GPU types of Sia's artifact and cluster descriptions.

A heterogeneous cluster is a list of *node types*, each with a count of
identical nodes, the replica slots per node and their kind (``slot``: a GPU
each, or a CPU core each; the allocator and the simulator count slots of any
kind alike, real jobs run a replica on one of them), the rule that caps a job's per-replica batch on that type
(device memory) and, for the local backend, the CPU-bandwidth fraction its
replicas run under (see :mod:`pollux_opt.backends.local.throttle`).  A job runs
on one type at a time (Sia, Jayaram Subramanya et al., SOSP 2023).

Descriptions come from a JSON file or a named preset (:data:`PRESETS`)::

    {"node_types": [
        {"name": "aws", "count": 6, "replicas_per_node": 4, "memory_gb": 16},
        {"name": "rtx", "count": 3, "replicas_per_node": 8, "memory_gb": 11, "cpu_quota": 0.5},
        {"name": "h100", "count": 1, "replicas_per_node": 1, "slot": "gpu"}
    ]}

:meth:`ClusterTypes.nodes` lists ``(node id, type, capacity)``, the rows a
cluster of typed nodes is built from.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from solvers import MAX_CPUS, InvalidProblem

from pollux_opt.model.domains import NAME, REQUIRED, Choice, Integer, Real, check_fields, domain_field, shown

__all__ = [
    "CPU_SLOT",
    "GPU_SLOT",
    "GPU_TYPES",
    "PRESETS",
    "REFERENCE_MEMORY_GB",
    "ClusterTypes",
    "GpuType",
    "NodeType",
    "load_cluster_types",
    "memory_scaled_local_bsz",
    "parse_cluster_types",
]


@dataclass(frozen=True)
class GpuType:
    """One GPU type of Sia's artifact, with the vendor figures the synthetic profiles scale by.

    Attributes:
        name: the artifact's type name (the suffix of ``placements-<name>.csv``).
        gpu: the device.
        gpus_per_node: devices per node, as profiled.
        memory_gb: device memory, GB.
        fp32_tflops: peak FP32 throughput, TFLOPS (vendor data sheet).
        memory_bandwidth_gbs: device memory bandwidth, GB/s (vendor data sheet).
        intra_node_gbs: GPU-to-GPU link inside a node, GB/s per direction
            (PCIe 3.0 x16: 16; NVLink 2 on V100 SXM2: 150; NVLink 3 on A100: 300).
        inter_node_gbps: the node's network, Gb/s; None where the artifact does
            not say (a single profiled node, or an on-premise network not described).
        machine: the profiled machine.
    """

    name: str
    gpu: str
    gpus_per_node: int
    memory_gb: float
    fp32_tflops: float
    memory_bandwidth_gbs: float
    intra_node_gbs: float
    inter_node_gbps: float | None
    machine: str


#: PCIe 3.0 x16, GB/s per direction (PCI-SIG: 8 GT/s x 16 lanes, 128b/130b encoding).
PCIE3_X16_GBS = 16.0

#: GPU types of Sia's artifact (siasosp23/artifacts, ``sia-simulator/simulator_config.py``:
#: ``cluster_ngpus_per_node`` and the comment naming each machine).  Device
#: figures from the NVIDIA data sheets (T4; GeForce RTX 2080 Ti reference
#: board; A100 40GB SXM; Quadro RTX 6000; V100 SXM2 32GB); networks from the
#: cloud providers' instance pages (g4dn.12xlarge: 50 Gb/s; ND40rs_v2:
#: 100 Gb/s InfiniBand) and the DGX A100 user guide (200 Gb/s HDR InfiniBand
#: per port).  ``dgx`` and ``dgx-ext`` are the same machine, profiled over
#: fewer and over more batch sizes (the artifact uses ``dgx-ext``).
GPU_TYPES: Mapping[str, GpuType] = {
    "aws": GpuType("aws", "NVIDIA T4", 4, 16.0, 8.1, 320.0, PCIE3_X16_GBS, 50.0, "AWS EC2 g4dn.12xlarge"),
    "rtx": GpuType("rtx", "NVIDIA GeForce RTX 2080 Ti", 8, 11.0, 13.4, 616.0, PCIE3_X16_GBS, None,
                   "on-premise 8-GPU server"),
    "dgx-ext": GpuType("dgx-ext", "NVIDIA A100 40GB SXM", 8, 40.0, 19.5, 1555.0, 300.0, 200.0, "NVIDIA DGX A100"),
    "quad": GpuType("quad", "NVIDIA Quadro RTX 6000", 4, 24.0, 16.3, 672.0, PCIE3_X16_GBS, None,
                    "on-premise 4-GPU server"),
    "azure": GpuType("azure", "NVIDIA V100 SXM2 32GB", 8, 32.0, 15.7, 900.0, 150.0, 100.0, "Azure ND40rs_v2"),
    "dgx": GpuType("dgx", "NVIDIA A100 40GB SXM", 8, 40.0, 19.5, 1555.0, 300.0, 200.0, "NVIDIA DGX A100"),
}

#: Memory of the device the single-type AdaptDL profiles were measured on (T4,
#: GB): the reference of the memory rule of :meth:`NodeType.max_local_bsz`.
REFERENCE_MEMORY_GB = GPU_TYPES["aws"].memory_gb

def memory_scaled_local_bsz(reference_max: int, memory_gb: float, *, max_batch_size: int | None = None) -> int:
    """``floor(reference_max * memory_gb / REFERENCE_MEMORY_GB)``, at least 1, at most ``max_batch_size``.

    The memory rule of the per-replica batch cap: activations grow linearly with
    the batch and dominate a profiled job's footprint, so the largest batch that
    fits scales with device memory.  ``reference_max`` is the cap on the
    reference device (T4, :data:`REFERENCE_MEMORY_GB`).
    """
    if isinstance(reference_max, bool) or not isinstance(reference_max, int) or reference_max < 1:
        raise InvalidProblem(f"reference_max must be an integer >= 1, got {shown(reference_max)}")
    cap = max(1, math.floor(reference_max * float(memory_gb) / REFERENCE_MEMORY_GB))
    return cap if max_batch_size is None else max(1, min(cap, int(max_batch_size)))


#: Replica slots of a node and node counts (the solvers' bound on a node's capacity).
_COUNT = Integer(gt=0, le=MAX_CPUS)
#: The kinds of a node type's slots: one CPU core, or one GPU (which a real
#: run's replica holds with a CPU core of its own for its process).
CPU_SLOT, GPU_SLOT = "cpu", "gpu"


@dataclass(frozen=True)
class NodeType:
    """``count`` identical nodes of one type.

    Attributes:
        name: the type's name (letters, digits, '.', '_', '-'), the suffix of its profile files.
        count: nodes of this type (>= 1).
        replicas_per_node: replica slots per node (GPUs; CPU cores on the local backend).
        memory_gb: device memory per replica, GB; None: the reference (T4) memory.
        cpu_quota: fraction of one CPU each replica slot may use on the local
            backend, in (0, 1]; 1 is unthrottled.
        slot: what a slot is, ``"cpu"`` (a CPU core) or ``"gpu"`` (a GPU):
            where a real job's replica runs (:mod:`pollux_opt.runtime.device`).
    """

    name: str = domain_field(REQUIRED, NAME)
    count: int = domain_field(REQUIRED, _COUNT)
    replicas_per_node: int = domain_field(REQUIRED, _COUNT)
    memory_gb: float | None = domain_field(None, Real(gt=0, unit="GB", none=True))
    cpu_quota: float = domain_field(1.0, Real(gt=0, le=1))
    slot: str = domain_field(CPU_SLOT, Choice((CPU_SLOT, GPU_SLOT)))

    def __post_init__(self) -> None:
        check_fields(self, prefix="node type ", names=("name",))
        check_fields(self, prefix=f"node type {self.name!r}: ")

    def max_local_bsz(self, reference_max: int, *, max_batch_size: int | None = None) -> int:
        """The per-replica batch cap on this type (:func:`memory_scaled_local_bsz`);
        ``reference_max`` is the job's cap on the reference device (T4)."""
        memory = REFERENCE_MEMORY_GB if self.memory_gb is None else self.memory_gb
        return memory_scaled_local_bsz(reference_max, memory, max_batch_size=max_batch_size)


@dataclass(frozen=True)
class ClusterTypes:
    """A heterogeneous cluster: node types with unique names, in order."""

    types: tuple[NodeType, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "types", tuple(self.types))
        if not self.types:
            raise InvalidProblem("node_types must not be empty")
        seen: set[str] = set()
        for i, t in enumerate(self.types):
            if not isinstance(t, NodeType):
                raise InvalidProblem(f"node_types[{i}] must be a NodeType, got {shown(t)}")
            if t.name in seen:
                raise InvalidProblem(f"node_types[{i}].name: duplicate node type {t.name!r}")
            seen.add(t.name)

    def __getitem__(self, name: str) -> NodeType:
        for t in self.types:
            if t.name == name:
                return t
        raise InvalidProblem(f"node type must be one of {list(self.names)}, got {shown(name)}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.types)

    def capacity(self) -> dict[str, int]:
        """Replica slots per type (count x replicas_per_node)."""
        return {t.name: t.count * t.replicas_per_node for t in self.types}

    @property
    def total_replicas(self) -> int:
        return sum(self.capacity().values())

    def nodes(self) -> list[tuple[str, str, int]]:
        """``(node id, type, capacity)`` per node, ids ``<type>-<i>`` in type order."""
        return [(f"{t.name}-{i}", t.name, t.replicas_per_node) for t in self.types for i in range(t.count)]


def _sia_type(name: str, count: int) -> NodeType:
    g = GPU_TYPES[name]
    return NodeType(name, count, g.gpus_per_node, g.memory_gb, slot=GPU_SLOT)


#: Named cluster descriptions.  ``sia-64``: Sia's default 64-GPU cluster
#: (SOSP 2023 evaluation; artifact ``cluster_nnodes = {"aws": 6, "dgx-ext": 2,
#: "rtx": 3}``), 6 x 4 T4 + 3 x 8 RTX 2080 Ti + 2 x 8 A100.  ``aws-64``: the
#: homogeneous 16 x 4 T4 cluster of Pollux's evaluation, as one type.
#: ``local-hetero``: a real run's cluster on a 2-CPU machine
#: (:mod:`pollux_opt.backends.local.nodes`), one node ``fast`` of one
#: unthrottled CPU and one node ``slow`` of one CPU at half its bandwidth.
PRESETS: Mapping[str, ClusterTypes] = {
    "sia-64": ClusterTypes((_sia_type("aws", 6), _sia_type("rtx", 3), _sia_type("dgx-ext", 2))),
    "aws-64": ClusterTypes((_sia_type("aws", 16),)),
    "local-hetero": ClusterTypes((NodeType("fast", 1, 1), NodeType("slow", 1, 1, cpu_quota=0.5))),
}

_FIELDS = tuple(f.name for f in fields(NodeType))


def _node_type(i: int, entry: Any) -> NodeType:
    where = f"node_types[{i}]"
    if not isinstance(entry, Mapping):
        raise InvalidProblem(f"{where} must be an object with fields {list(_FIELDS)}, got {shown(entry)}")
    unknown = sorted(set(entry) - set(_FIELDS))
    if unknown:
        raise InvalidProblem(f"{where}: unknown field {unknown[0]!r} (fields: {list(_FIELDS)})")
    missing = [f for f in ("name", "count", "replicas_per_node") if f not in entry]
    if missing:
        raise InvalidProblem(f"{where}: missing field {missing[0]!r}")
    try:
        return NodeType(**entry)
    except InvalidProblem as exc:
        raise InvalidProblem(f"{where}: {exc}") from None


def parse_cluster_types(data: Any) -> ClusterTypes:
    """A :class:`ClusterTypes` from the JSON object of the module docstring.

    Raises:
        InvalidProblem: naming the field and the value (``node_types[1]: node
            type 'rtx': count must be an integer in (0, ...], got 0``).
    """
    if not isinstance(data, Mapping) or "node_types" not in data:
        raise InvalidProblem(f"cluster description must be an object with a 'node_types' list, got {shown(data)}")
    unknown = sorted(set(data) - {"node_types"})
    if unknown:
        raise InvalidProblem(f"cluster description: unknown field {unknown[0]!r}")
    entries = data["node_types"]
    if isinstance(entries, (str, bytes, Mapping)) or not isinstance(entries, Sequence):
        raise InvalidProblem(f"node_types must be a list of objects, got {shown(entries)}")
    return ClusterTypes(tuple(_node_type(i, e) for i, e in enumerate(entries)))


def load_cluster_types(source: str | Path) -> ClusterTypes:
    """A preset by name (:data:`PRESETS`) or a JSON file by path.

    Raises:
        InvalidProblem: neither a preset nor a readable JSON file, or a bad field.
    """
    if isinstance(source, str) and source in PRESETS:
        return PRESETS[source]
    path = Path(source)
    if not path.is_file():
        raise InvalidProblem(
            f"cluster description must be a preset {sorted(PRESETS)} or a JSON file, got {str(source)!r}"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidProblem(f"cluster description {str(path)!r} is not readable JSON: {exc}") from None
    try:
        return parse_cluster_types(data)
    except InvalidProblem as exc:
        raise InvalidProblem(f"{str(path)!r}: {exc}") from None
