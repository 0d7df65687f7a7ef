"""The service's state in SQLite (``<state>/service.db``, WAL mode).

**One source of truth.**  A job's history is the run's event log
(``<state>/events.jsonl``, :mod:`pollux_opt.records.events`), exactly as for a
workload run.  The database holds two kinds of tables:

* **inputs**, what clients asked: ``submissions`` (each job's entry, its id
  and submission time) and ``requests`` (cancel, a new weight).  Only the API
  writes them, only by inserting rows, and a submission is committed (with
  ``synchronous=FULL``: on disk) before the client gets its id.  They are the
  open queue the scheduler loop reads (:class:`OpenSource`).  In a run of a
  workload, which the API only watches, the index adds each job's
  ``submissions`` row from its ``submit`` event instead.
* **an index of the event log**, for queries: ``jobs`` (each job's state and
  latest numbers), ``transitions`` (every state change with its time and
  reason), ``rounds`` (each allocation round) and ``reports`` (each running
  job's periodic goodput and batch size).  Only the scheduler loop
  writes them, from each event right after it is appended to the log
  (:class:`EventIndex`), and they are rebuilt from the log at every start, so
  that the index never disagrees with the log, a crash between the two included.

A job the loop has not taken yet has no ``jobs`` row: it is ``queued``.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from pollux_opt.lifecycle import JobState
from pollux_opt.records.events import jsonable
from pollux_opt.records.replay import JobTrack
from pollux_opt.workloads.job import WorkloadJob
from pollux_opt.workloads.source import Request

__all__ = ["DB_FILE", "EventIndex", "OpenSource", "Store", "connect", "connect_reader"]

#: The database's file in the state directory.
DB_FILE = "service.db"
#: Seconds a connection waits for another's write lock before it gives up.
BUSY_TIMEOUT_S = 10.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS submissions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    name TEXT,
    job TEXT NOT NULL,              -- WorkloadJob.to_json() without id and arrival_s
    submitted_unix REAL NOT NULL,
    idem_key TEXT UNIQUE,           -- the client's Idempotency-Key (a retried POST gets the same job)
    progress_target REAL,           -- the job's resolved spec's (M0-equivalent iterations; NULL: not set) ...
    init_batch_size INTEGER         -- ... and M0 (samples): a running job's eta_s
);
CREATE TABLE IF NOT EXISTS requests (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL REFERENCES submissions(id),
    kind TEXT NOT NULL CHECK (kind IN ('cancel', 'weight')),
    weight REAL,
    made_unix REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    reason TEXT,
    submit_t REAL, start_t REAL, end_t REAL,
    weight REAL, cancelling INTEGER NOT NULL DEFAULT 0,
    placement TEXT NOT NULL DEFAULT '{}',
    replicas INTEGER NOT NULL DEFAULT 0, nodes INTEGER NOT NULL DEFAULT 0,
    batch_size INTEGER, local_bsz INTEGER, accum_steps INTEGER,
    goodput REAL, goodput_base REAL, progress REAL, step INTEGER,
    restarts INTEGER NOT NULL DEFAULT 0,
    metric REAL, final_metric REAL, verified INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state);
CREATE TABLE IF NOT EXISTS transitions (
    n INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL, t REAL NOT NULL, old TEXT, new TEXT NOT NULL, reason TEXT
);
CREATE INDEX IF NOT EXISTS transitions_by_job ON transitions (job_id);
CREATE TABLE IF NOT EXISTS rounds (
    n INTEGER PRIMARY KEY AUTOINCREMENT,
    t REAL NOT NULL, objective REAL, solver_s REAL, status TEXT, placement TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS reports (  -- each running job's periodic measurements, and its model's view of them
    n INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL, t REAL NOT NULL, goodput REAL, batch_size INTEGER, replicas INTEGER NOT NULL,
    throughput REAL, predicted_throughput REAL,       -- samples/s: measured, and the model's for that configuration
    noise_scale REAL, init_batch_size INTEGER, max_batch_size INTEGER   -- phi, M0 and the largest batch: E(M)
);
CREATE INDEX IF NOT EXISTS reports_by_job ON reports (job_id);
"""
#: Terminal states, as SQL values (a job in one has no eta).
_TERMINAL = ", ".join(f"'{s.value}'" for s in JobState if s.terminal)
#: A job as clients see it: (key, SQL value over ``submissions s LEFT JOIN jobs j``).  Built by SQLite so that a
#: long list costs the API no Python per job (and no GIL while SQLite works).
_JOB_FIELDS = (
    ("id", "s.id"), ("name", "s.name"), ("entry", "json_extract(s.job, '$.entry')"),
    ("kind", "json_extract(s.job, '$.kind')"), ("spec", "json(COALESCE(json_extract(s.job, '$.spec'), '{}'))"),
    ("submitted_unix", "s.submitted_unix"), ("state", f"COALESCE(j.state, '{JobState.QUEUED.value}')"),
    ("reason", "j.reason"), ("submit_t", "j.submit_t"), ("start_t", "j.start_t"), ("end_t", "j.end_t"),
    ("weight", "COALESCE(j.weight, json_extract(s.job, '$.weight'), 1.0)"),
    ("cancelling", "json(CASE WHEN j.cancelling THEN 'true' ELSE 'false' END)"),
    ("placement", "json(COALESCE(j.placement, '{}'))"), ("replicas", "COALESCE(j.replicas, 0)"),
    ("nodes", "COALESCE(j.nodes, 0)"), ("batch_size", "j.batch_size"), ("local_bsz", "j.local_bsz"),
    ("accum_steps", "j.accum_steps"), ("goodput", "j.goodput"), ("goodput_base", "j.goodput_base"),
    ("speedup", "CASE WHEN j.goodput_base THEN j.goodput / j.goodput_base END"),  # vs one replica at M0
    ("progress", "j.progress"), ("step", "j.step"), ("restarts", "COALESCE(j.restarts, 0)"),
    ("metric", "j.metric"), ("final_metric", "j.final_metric"),
    ("verified", "json(CASE WHEN j.verified THEN 'true' ELSE 'false' END)"),
    # seconds to progress_target at the job's goodput: (target - progress) * M0 / goodput, samples / (samples/s)
    ("eta_s", f"CASE WHEN j.goodput > 0 AND j.state NOT IN ({_TERMINAL}) THEN "
              "max(s.progress_target - COALESCE(j.progress, 0), 0) * s.init_batch_size / j.goodput END"),
)
_JOB_JSON = "json_object(" + ", ".join(f"'{key}', {value}" for key, value in _JOB_FIELDS) + ")"
#: The index's tables, emptied before a rebuild.
_INDEX_TABLES = ("jobs", "transitions", "rounds", "reports")


def connect(path: str | Path, *, durable: bool) -> sqlite3.Connection:
    """A connection to the database at ``path`` (created with its schema), in
    autocommit mode, usable from any thread (callers serialize their use).
    ``durable``: every commit is fsynced (the API's inputs); otherwise only
    checkpoints are (the index, which the log rebuilds)."""
    conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
    conn.executescript(_SCHEMA)
    return conn


def connect_reader(path: str | Path) -> sqlite3.Connection:
    """A read-only connection to the database at ``path`` (made by :func:`connect`
    first): queries only, no schema or settings to write."""
    conn = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S,
                           isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    return conn


class Store:
    """The API's side: it records submissions and requests and reads the index.

    Thread-safe: one writing connection behind a lock, one reading connection per thread.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = path
        self._conn = connect(path, durable=True)
        self._lock = threading.Lock()  # the writer's
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []

    def _reader(self) -> sqlite3.Connection:
        """This thread's read connection: readers never wait for the writer's lock
        (WAL: each query reads the last committed state)."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = connect_reader(self.path)
            with self._lock:
                self._readers.append(conn)
        return conn

    def close(self) -> None:
        with self._lock:
            self._conn.close()
            for conn in self._readers:
                conn.close()

    # ------------------------------------------------------------- inputs
    def submit(self, job: Mapping[str, Any], name: str | None, idem_key: str | None = None, *,
               progress_target: float | None = None, init_batch_size: int | None = None) -> tuple[str, bool]:
        """Record a submission (``job``: a workload job's fields without ``id``
        and ``arrival_s``, already checked); returns ``(job id, created)`` once
        it is on disk.  A key already used returns that submission's id and False.
        ``progress_target`` and ``init_batch_size``: the job's resolved spec's (its ``eta_s``)."""
        with self._lock:
            if idem_key is not None:
                row = self._conn.execute("SELECT id FROM submissions WHERE idem_key = ?", (idem_key,)).fetchone()
                if row is not None:
                    return row["id"], False
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                seq = self._conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM submissions").fetchone()[0]
                job_id = str(seq)
                self._conn.execute(
                    "INSERT INTO submissions (seq, id, name, job, submitted_unix, idem_key, progress_target, "
                    "init_batch_size) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (seq, job_id, name, json.dumps(jsonable(dict(job))), time.time(), idem_key, progress_target,
                     init_batch_size))
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        return job_id, True

    def request(self, job_id: str, kind: str, weight: float | None = None) -> int:
        """Record a request about ``job_id`` (on disk on return); its number."""
        with self._lock:
            cur = self._conn.execute("INSERT INTO requests (job_id, kind, weight, made_unix) VALUES (?, ?, ?, ?)",
                                     (job_id, kind, weight, time.time()))
            return int(cur.lastrowid)

    # ------------------------------------------------------------- queries
    def job(self, job_id: str) -> dict | None:
        """One job as :meth:`jobs` shows it, with its ``transitions``; None if unknown."""
        row = self._reader().execute(f"SELECT {_JOB_JSON} FROM submissions s LEFT JOIN jobs j ON j.id = s.id "
                                     f"WHERE s.id = ?", (job_id,)).fetchone()
        if row is None:
            return None
        moves = self._reader().execute(
            "SELECT t, old, new, reason FROM transitions WHERE job_id = ? ORDER BY n", (job_id,)).fetchall()
        return {**json.loads(row[0]), "transitions": [dict(m) for m in moves]}

    def jobs(self, state: str | None = None) -> list[dict]:
        """Every job, oldest first (only those in ``state`` if given)."""
        return json.loads(self.jobs_json(state))

    def jobs_json(self, state: str | None = None) -> str:
        """:meth:`jobs` as JSON text (the API's answer, with no decoding on the way).

        One row from SQLite, not one per job: the reading thread releases and
        retakes the GIL at each row, and under load each retake waits."""
        where, args = ("", ()) if state is None else (
            f"WHERE COALESCE(j.state, '{JobState.QUEUED.value}') = ?", (state,))
        # The subquery's order reaches the aggregate (an aggregate over an ordered subquery is not flattened).
        return self._reader().execute(
            f"SELECT json_group_array(json(job)) FROM (SELECT {_JOB_JSON} AS job FROM submissions s "
            f"LEFT JOIN jobs j ON j.id = s.id {where} ORDER BY s.seq)", args).fetchone()[0]

    def counts(self) -> dict[str, int]:
        """Jobs by state (every state of the lifecycle, 0 where none)."""
        rows = self._reader().execute(
            "SELECT COALESCE(j.state, 'queued') AS state, COUNT(*) AS n FROM submissions s "
            "LEFT JOIN jobs j ON j.id = s.id GROUP BY 1").fetchall()
        return {**{s.value: 0 for s in JobState}, **{r["state"]: int(r["n"]) for r in rows}}

    def last_round(self) -> dict | None:
        """The newest allocation round (``t``, ``objective``, ``solver_s``, ``status``, ``placement``)."""
        row = self._reader().execute("SELECT * FROM rounds ORDER BY n DESC LIMIT 1").fetchone()
        return None if row is None else {**dict(row), "placement": json.loads(row["placement"])}

    def history(self, since: float = 0.0) -> dict[str, list[dict]]:
        """What happened from Unix time ``since`` on, oldest first: ``rounds``
        (``t``, ``solver_s``, ``objective``, ``placement``), ``transitions``
        (``job_id``, ``t``, ``new``) and ``reports`` (the columns of its table)."""
        reader = self._reader()
        rounds = reader.execute("SELECT t, solver_s, objective, placement FROM rounds WHERE t >= ? ORDER BY n",
                                (since,)).fetchall()
        return {
            "rounds": [{**dict(r), "placement": json.loads(r["placement"])} for r in rounds],
            "transitions": [dict(r) for r in reader.execute(
                "SELECT job_id, t, new FROM transitions WHERE t >= ? ORDER BY n", (since,)).fetchall()],
            "reports": [dict(r) for r in reader.execute(
                "SELECT job_id, t, goodput, batch_size, replicas, throughput, predicted_throughput, noise_scale, "
                "init_batch_size, max_batch_size FROM reports WHERE t >= ? ORDER BY n", (since,)).fetchall()],
        }

    def values(self, sql: str, args: tuple = ()) -> list[float]:
        """The first column of a read-only query (the metrics' histograms)."""
        return [r[0] for r in self._reader().execute(sql, args).fetchall() if r[0] is not None]


class EventIndex:
    """The scheduler loop's side: folds each event of the log into the index
    tables (see the module docstring).  ``started_unix``: the run's start, to
    turn the log's run seconds into Unix times."""

    def __init__(self, path: str | Path, started_unix: float) -> None:
        self._conn = connect(path, durable=False)
        self.started_unix = float(started_unix)
        self._tracks: dict[str, JobTrack] = {}
        self._starts: dict[str, float] = {}  # Unix time each job first held CPUs
        self._lock = threading.Lock()

    def close(self) -> None:
        self._conn.close()

    def rebuild(self, events: Iterable[Mapping]) -> None:
        """Empty the index and fold ``events`` (the whole log) into it, in one transaction."""
        with self._lock:
            self._tracks.clear()
            self._starts.clear()
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                for table in _INDEX_TABLES:
                    self._conn.execute(f"DELETE FROM {table}")
                for event in events:
                    self._fold(event)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def apply(self, event: Mapping) -> None:
        """Fold one event just appended to the log."""
        with self._lock:
            self._fold(event)

    def _fold(self, event: Mapping) -> None:
        etype, t = event["type"], self.started_unix + float(event["t"])
        if etype == "allocation":
            self._conn.execute("INSERT INTO rounds (t, objective, solver_s, status, placement) VALUES (?, ?, ?, ?, ?)",
                               (t, _finite(event.get("objective")), _finite(event.get("solver_s")),
                                event.get("status"), json.dumps(event.get("placement") or {})))
            return
        job_id = event.get("job_id")
        if job_id is None:
            return
        if etype == "submit":  # a workload's job (a submission's row is there already: kept as it is)
            self._conn.execute("INSERT OR IGNORE INTO submissions (id, job, submitted_unix) VALUES (?, ?, ?)",
                               (job_id, json.dumps({"kind": event.get("kind"), "weight": event.get("weight", 1.0)}),
                                t))
        track = self._tracks.setdefault(job_id, JobTrack(id=job_id))
        old = track.state if track.submitted else None
        track.apply(event)
        fields = {"state": track.state.value, "weight": track.weight, "cancelling": int(track.cancelling),
                  "placement": json.dumps(track.placement), "replicas": track.held, "nodes": len(track.placement),
                  "restarts": track.restarts, "submit_t": self._unix(track.submit), "end_t": self._unix(track.end),
                  "metric": _finite(track.last_metric), "final_metric": _finite(track.final_metric),
                  "verified": int(track.verified)}
        if track.held and job_id not in self._starts:  # its first placement onto CPUs
            self._starts[job_id] = t
        fields["start_t"] = self._starts.get(job_id)
        if etype == "report":
            fields.update({k: _finite(event.get(k)) for k in (
                "batch_size", "local_bsz", "accum_steps", "goodput", "goodput_base", "progress", "step")})
            self._conn.execute(
                "INSERT INTO reports (job_id, t, goodput, batch_size, replicas, throughput, predicted_throughput, "
                "noise_scale, init_batch_size, max_batch_size) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (job_id, t, fields["goodput"], fields["batch_size"], track.held,
                 *(_finite(event.get(k)) for k in ("throughput", "predicted_throughput", "noise_scale",
                                                   "init_batch_size", "max_batch_size"))))
        elif event.get("progress") is not None:
            fields["progress"] = _finite(event["progress"])
        if track.state is not old:
            fields["reason"] = _reason(event)
            self._conn.execute("INSERT INTO transitions (job_id, t, old, new, reason) VALUES (?, ?, ?, ?, ?)",
                               (job_id, t, None if old is None else old.value, track.state.value, fields["reason"]))
        names = ", ".join(fields)
        updates = ", ".join(f"{k} = excluded.{k}" for k in fields)
        self._conn.execute(f"INSERT INTO jobs (id, {names}) VALUES (?, {', '.join('?' * len(fields))}) "
                           f"ON CONFLICT (id) DO UPDATE SET {updates}", (job_id, *fields.values()))

    def _unix(self, t: float) -> float | None:
        return None if t is None or math.isnan(t) else self.started_unix + t


def _finite(value: Any) -> Any:
    """``value`` with a non-finite float as None (SQLite's NULL)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _reason(event: Mapping) -> str:
    """Why the event moved its job: its ``reason`` field, else its type."""
    reason = event.get("reason")
    if event["type"] == "complete":
        return "verified" if event.get("verified") else "completed"
    return str(reason) if reason else event["type"]


class OpenSource:
    """The open queue of a service (a :class:`~pollux_opt.workloads.source.JobSource`):
    the submissions and requests in the database, read by the scheduler loop.

    Args:
        path: the database.
        started_unix: the run's start; a job's ``arrival_s`` is its submission's time after it.
        name: what the progress view calls the run.
    """

    closed = False

    def __init__(self, path: str | Path, started_unix: float, name: str = "service") -> None:
        self._conn = connect(path, durable=False)
        self.started_unix, self.name = float(started_unix), name
        self._seen = 0  # the newest submission taken
        self._event = threading.Event()

    def notify(self) -> None:
        """Something was added: wake the loop (called by the API after its commit)."""
        self._event.set()

    def wait(self, seconds: float) -> None:
        self._event.wait(seconds)
        self._event.clear()

    def new_jobs(self) -> Sequence[WorkloadJob]:
        rows = self._conn.execute("SELECT seq, id, job, submitted_unix FROM submissions WHERE seq > ? ORDER BY seq",
                                  (self._seen,)).fetchall()
        out = []
        for row in rows:
            self._seen = int(row["seq"])
            fields = {**json.loads(row["job"]), "id": row["id"],
                      "arrival_s": max(float(row["submitted_unix"]) - self.started_unix, 0.0)}
            out.append(WorkloadJob.from_json(fields))
        return out

    def requests(self, after: int) -> Sequence[Request]:
        rows = self._conn.execute("SELECT seq, job_id, kind, weight FROM requests WHERE seq > ? ORDER BY seq",
                                  (after,)).fetchall()
        return [Request(int(r["seq"]), r["job_id"], r["kind"], r["weight"]) for r in rows]

    def close(self) -> None:
        self._conn.close()
