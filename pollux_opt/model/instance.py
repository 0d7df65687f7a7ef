"""Versioned JSON instance format (``version: 3``; versions 1 and 2 still read).

An instance file holds a cluster, jobs with explicit speedup tables and
allocation options::

    {"version": 2,
     "cluster": {"nodes": [{"id": "n0", "cpus": 4}, {"id": "n1", "cpus": 4}]},
     "jobs": [{"id": "a", "speedup_table": [[1, 1, 1.0], [1, 2, 1.8], [2, 2, 1.6]],
               "min_replicas": 0, "max_replicas": 2, "placement": {"n0": 1},
               "restarts": 0, "age": 120.0, "weight": 1.0, "restart_delay": 12.5}],
     "options": {"p": -1, "restart_delay": 30, "interference_avoidance": true,
                 "max_nodes_per_job": 16, "time_limit": 10, "mip_gap": 0.0001}}

Only ``id``, ``speedup_table`` (rows ``[num_nodes, num_replicas, speedup]``)
and ``max_replicas`` are required per job; everything else defaults as in
:class:`pollux_opt.Options` and :class:`pollux_opt.Job`.  ``options`` may also
name ``solver`` and ``seed``.  Version 2 adds the per-job ``restart_delay``
(absent or null: ``options.restart_delay``); a version 1 file has no such
field, so every job uses ``options.restart_delay``.  Version 3 adds node
types: ``cluster.nodes[].type`` (default ``"default"``) and, instead of
``speedup_table``, per-type tables ``"speedup_tables": {"fast": [[1, 1, 2.0]], ...}``
(a job runs only on the types it lists).  See ``docs/instance-format.md``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Mapping

from solvers import InvalidProblem

from pollux_opt.model.cluster import DEFAULT_NODE_TYPE, POSITIVE_COUNT, Cluster, Node
from pollux_opt.model.domains import NAME, Choice, Integer, Real, Text, check, shown
from pollux_opt.model.job import Job
from pollux_opt.model.typed import TypedTable
from pollux_opt.model.options import Options
from pollux_opt.model.validate import check_deadline, read_json

__all__ = [
    "FORMAT_VERSION",
    "READ_VERSIONS",
    "Instance",
    "instance_to_json",
    "load_instance",
    "parse_instance",
    "read_instance_json",
]

#: The instance format version this code writes (and assumes when a file names none).
FORMAT_VERSION = 3
#: The versions this code reads: 1 (no per-job restart delay), 2 (no node types) and 3.
READ_VERSIONS = (1, 2, 3)

#: The job fields of each version.
_JOB_FIELDS_V1 = frozenset(
    {"id", "speedup_table", "min_replicas", "max_replicas", "placement", "restarts", "age", "weight"}
)
_JOB_FIELDS = {1: _JOB_FIELDS_V1, 2: _JOB_FIELDS_V1 | {"restart_delay"},
               3: _JOB_FIELDS_V1 | {"restart_delay", "speedup_tables"}}
#: The ``version`` field: one of the versions read (``true`` is not version 1).
_VERSION = Choice(READ_VERSIONS)
#: Node and job ids: strings, as documented (``null`` is not the id ``"None"``).
_ID = Text()
#: The entries of a speedup table row ``[num_nodes, num_replicas, speedup]``:
#: integers and a number, checked in full (bounds, finiteness) by :class:`Job`,
#: which names the pair.
_ROW_COUNT = Integer()
_ROW_SPEEDUP = Real(finite=False)


@dataclass(frozen=True)
class Instance:
    """A parsed instance: cluster, jobs and options."""

    cluster: Cluster
    jobs: tuple[Job, ...]
    options: Options


def _require(obj: Mapping, key: str, where: str) -> Any:
    if key not in obj:
        raise InvalidProblem(f"{where}.{key} is required")
    return obj[key]


def _parse_table(rows: Any, where: str) -> dict[tuple[int, int], float]:
    if not isinstance(rows, list):
        raise InvalidProblem(f"{where}.speedup_table must be a list of [num_nodes, num_replicas, speedup], got {rows!r}")
    table: dict[tuple[int, int], float] = {}
    for i, row in enumerate(rows):
        if (
            not isinstance(row, list)
            or len(row) != 3
            or not all(_ROW_COUNT.accepts(x) for x in row[:2])
            or not (_ROW_SPEEDUP.accepts(row[2]) or (isinstance(row[2], float) and math.isnan(row[2])))
        ):
            raise InvalidProblem(
                f"{where}.speedup_table[{i}] must be [num_nodes, num_replicas, speedup], got {row!r}"
            )
        key = (row[0], row[1])
        if key in table:
            raise InvalidProblem(f"{where}.speedup_table[{i}] repeats (num_nodes, num_replicas) = {key}")
        table[key] = float(row[2])
    return table


def _parse_speedup(jd: Mapping, where: str) -> dict[tuple[int, int], float] | TypedTable:
    """A job's ``speedup_table``, or its per-type ``speedup_tables`` (exactly one of the two)."""
    if ("speedup_table" in jd) == ("speedup_tables" in jd):
        raise InvalidProblem(f"{where}.speedup_table is required (or, in version 3, speedup_tables; not both)")
    if "speedup_table" in jd:
        return _parse_table(jd["speedup_table"], where)
    tables = jd["speedup_tables"]
    if not isinstance(tables, dict) or not tables:
        raise InvalidProblem(f"{where}.speedup_tables must be a non-empty object {{type: table}}, got {tables!r}")
    out = {}
    for t, rows in tables.items():
        check("type", t, NAME, prefix=f"{where}.speedup_tables ")
        out[t] = _parse_table(rows, f"{where}.speedup_tables[{t!r}]")
    return TypedTable.of(out)


def _table_rows(table: Mapping[tuple[int, int], float]) -> list[list]:
    return [[n, k, s] for (n, k), s in sorted(table.items())]


def _parse_cluster(data: Mapping, version: int) -> Cluster:
    cluster_data = _require(data, "cluster", "instance")
    if not isinstance(cluster_data, dict):
        raise InvalidProblem(f"cluster must be an object, got {cluster_data!r}")
    nodes_data = _require(cluster_data, "nodes", "cluster")
    if not isinstance(nodes_data, list):
        raise InvalidProblem(f"cluster.nodes must be a list, got {nodes_data!r}")
    nodes = []
    for i, nd in enumerate(nodes_data):
        if not isinstance(nd, dict):
            raise InvalidProblem(f"cluster.nodes[{i}] must be an object, got {nd!r}")
        where = f"cluster.nodes[{i}]"
        if version < 3 and "type" in nd:
            raise InvalidProblem(f"{where}: unknown field 'type' in a version {version} file "
                                 f"(node types need version 3)")
        nid = check("id", _require(nd, "id", where), _ID, prefix=f"{where}.")
        cpus = check("cpus", _require(nd, "cpus", where), POSITIVE_COUNT, prefix=f"{where}.")
        kind = check("type", nd.get("type", DEFAULT_NODE_TYPE), NAME, prefix=f"{where}.")
        nodes.append(Node(nid, cpus, kind))
    return Cluster(tuple(nodes))


def _parse_job(jd: Any, where: str, version: int) -> Job:
    if not isinstance(jd, dict):
        raise InvalidProblem(f"{where} must be an object, got {jd!r}")
    unknown = set(jd) - _JOB_FIELDS[version]
    if unknown:
        name = sorted(unknown)[0]
        hint = {"restart_delay": " (per-job restart delays need version 2)",
                "speedup_tables": " (per-type speedup tables need version 3)"}.get(name, "")
        raise InvalidProblem(f"{where}: unknown field {name!r} in a version {version} file{hint}")
    placement = jd.get("placement", {})
    if not isinstance(placement, dict):
        raise InvalidProblem(f"{where}.placement must be an object {{node: replicas}}, got {placement!r}")
    kwargs = {k: jd[k] for k in ("min_replicas", "restarts", "age", "weight", "restart_delay") if k in jd}
    return Job(
        id=check("id", _require(jd, "id", where), _ID, prefix=f"{where}."),
        speedup=_parse_speedup(jd, where),
        max_replicas=_require(jd, "max_replicas", where),
        placement={str(n): k for n, k in placement.items()},
        **kwargs,
    )


def parse_instance(data: Any, *, deadline: float | None = None) -> Instance:
    """Parse an already-decoded JSON object into an :class:`Instance`.

    Reads every version in :data:`READ_VERSIONS`; a file without ``version``
    is read as :data:`FORMAT_VERSION`.  ``deadline`` (``time.monotonic()``
    seconds, optional) bounds the work: checking a job costs about 0.1 ms, so
    a file of a million jobs is checked for minutes.

    Raises:
        InvalidProblem: naming the offending field and its value.
        solvers.OutOfTime: (an :class:`InvalidProblem`) ``deadline`` passed.
    """
    if not isinstance(data, dict):
        raise InvalidProblem(f"instance must be a JSON object, got {type(data).__name__}")
    version = check("version", data.get("version", FORMAT_VERSION), _VERSION)
    unknown = set(data) - {"version", "cluster", "jobs", "options"}
    if unknown:
        raise InvalidProblem(f"unknown top-level field {sorted(unknown)[0]!r}")
    cluster = _parse_cluster(data, version)
    jobs_data = _require(data, "jobs", "instance")
    if not isinstance(jobs_data, list):
        raise InvalidProblem(f"jobs must be a list, got {jobs_data!r}")
    jobs = []
    for i, jd in enumerate(jobs_data):
        check_deadline(deadline, i, len(jobs_data), "checking the instance")
        jobs.append(_parse_job(jd, f"jobs[{i}]", version))
    options_data = data.get("options", {})
    if not isinstance(options_data, dict):
        raise InvalidProblem(f"options must be an object, got {options_data!r}")
    return Instance(cluster, tuple(jobs), Options.from_mapping(options_data))


def read_instance_json(path: str | os.PathLike) -> Any:
    """The decoded JSON value of an instance file, read as bytes: UTF-8 as JSON
    requires (RFC 8259; a byte-order mark is allowed).

    Raises:
        InvalidProblem: naming the file (see :func:`pollux_opt.model.validate.read_json`).
    """
    return read_json(path, "instance file")


def load_instance(path: str | os.PathLike, *, deadline: float | None = None) -> Instance:
    """Read an instance JSON file (see :func:`read_instance_json`, :func:`parse_instance`).

    Raises:
        InvalidProblem: unreadable file, wrong encoding, malformed JSON, or invalid content.
    """
    return parse_instance(read_instance_json(path), deadline=deadline)


def instance_to_json(instance: Instance) -> dict:
    """The JSON object (version :data:`FORMAT_VERSION`) of an instance with explicit
    speedup tables (inverse of :func:`parse_instance`); a job's ``restart_delay``
    is written only when set."""
    if not isinstance(instance, Instance):
        raise InvalidProblem(f"instance must be an Instance, got {shown(instance)}")
    jobs = []
    for job in instance.jobs:
        if isinstance(job.speedup, TypedTable):
            speedup = {"speedup_tables": {t: _table_rows(job.speedup.table(t)) for t in job.speedup.types}}
        elif isinstance(job.speedup, dict):
            speedup = {"speedup_table": _table_rows(job.speedup)}
        else:
            raise InvalidProblem(f"job {job.id!r}: only explicit speedup tables can be written to an instance file")
        jobs.append(
            {
                "id": job.id,
                **speedup,
                "min_replicas": job.min_replicas,
                "max_replicas": job.max_replicas,
                "placement": dict(job.placement),
                "restarts": job.restarts,
                "age": job.age,
                "weight": job.weight,
                **({} if job.restart_delay is None else {"restart_delay": job.restart_delay}),
            }
        )
    o = instance.options
    return {
        "version": FORMAT_VERSION,
        "cluster": {"nodes": [{"id": n.id, "cpus": n.cpus,
                               **({} if n.type == DEFAULT_NODE_TYPE else {"type": n.type})}
                              for n in instance.cluster.nodes]},
        "jobs": jobs,
        "options": {
            "p": o.p,
            "restart_delay": o.restart_delay,
            "interference_avoidance": o.interference_avoidance,
            "max_nodes_per_job": o.max_nodes_per_job,
            "solver": o.solver,
            "time_limit": o.time_limit,
            "mip_gap": o.mip_gap,
            "seed": o.seed,
        },
    }
