"""The service's HTTP API, built by :func:`make_app`.

``POST /api/v1/jobs`` submits a job entry (201 ``{"id"}``; 200 and the same id
for an ``Idempotency-Key`` seen before); ``GET /api/v1/jobs[?state=S]`` and
``/api/v1/jobs/{id}`` show jobs with ``eta_s``; ``POST /api/v1/jobs/{id}/cancel``
(202) and ``PATCH /api/v1/jobs/{id}`` ``{"weight"}`` (200) are requests the
scheduler loop applies (409 once the job ended); ``GET /api/v1/jobs/{id}/logs``
reads or follows a worker's log from a byte offset; ``GET /api/v1/cluster``,
``GET /api/v1/events`` (server-sent events of the event log), ``GET /healthz``
and the dashboard at ``/`` (its files under ``/static/``; no token needed for
these: they hold no data) and ``GET /metrics`` (Prometheus).  Every error is JSON
``{"error": message}``.  A submission is checked as a workload file's job is,
importing the job's module: the trust model of a workload file (``docs/service.md``).
"""

import hmac
import logging
import math
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from fastapi import FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, ConfigDict, Field
from solvers import MAX_REPLICAS, WEIGHT_RANGE, InvalidProblem
from starlette.exceptions import HTTPException

from pollux_opt.backends.local.rundir import EVENTS_FILE
from pollux_opt.lifecycle import JobState
from pollux_opt.model.domains import check, shown
from pollux_opt.model.job import WEIGHT
from pollux_opt.service.db import Store
from pollux_opt.service import tail
from pollux_opt.service.dashboard import add_dashboard_routes
from pollux_opt.service.errors import ApiError
from pollux_opt.service.metrics import cpu_holders, service_registry
from pollux_opt.workloads.job import Workload, WorkloadJob

__all__ = ["API", "MAX_BODY_BYTES", "make_app"]

log = logging.getLogger(__name__)

#: The API's path prefix.
API = "/api/v1"
#: Paths answered without the token: the health check and the dashboard's files.
PUBLIC_PATHS, PUBLIC_PREFIX = frozenset({"/healthz", "/"}), "/static/"
#: Largest request body, bytes: a job entry is a few hundred bytes; this bounds what a client makes the server parse.
MAX_BODY_BYTES = 64 * 1024
#: Longest job name and Idempotency-Key, characters.
NAME_MAX_CHARS, IDEM_KEY_MAX_CHARS = 100, 200
#: Largest byte offset a client may ask for (a file offset fits a signed 64-bit integer).
MAX_OFFSET = 2**62
#: The id of the workload job a submission is checked as (error messages name it).
_PROBE_ID = "submission"
_STATES = tuple(s.value for s in JobState)
_DIGITS = re.compile(r"[0-9]{1,18}")
_WEIGHT_BOUNDS = {"ge": WEIGHT_RANGE[0], "le": WEIGHT_RANGE[1], "allow_inf_nan": False}


class JobIn(BaseModel):
    """A submission: exactly one of ``kind`` and ``entry``, as a workload file's job."""

    model_config = ConfigDict(extra="forbid")
    kind: str | None = None
    entry: str | None = None
    import_dir: str | None = None
    spec: dict[str, Any] = Field(default_factory=dict)
    replicas: int = Field(1, ge=1, le=MAX_REPLICAS)
    batch_size: int | None = Field(None, ge=1)
    min_replicas: int = Field(1, ge=1, le=MAX_REPLICAS)
    max_replicas: int | None = Field(None, ge=1, le=MAX_REPLICAS)
    weight: float = Field(1.0, **_WEIGHT_BOUNDS)
    name: str | None = Field(None, max_length=NAME_MAX_CHARS)


class WeightIn(BaseModel):
    """A job's new weight (its priority in the objective)."""

    model_config = ConfigDict(extra="forbid")
    weight: float = Field(**_WEIGHT_BOUNDS)


@dataclass(frozen=True)
class _Context:
    """What the routes read and call (see :func:`make_app`)."""

    store: Store
    state_dir: Path
    notify: Callable[[], None] | None
    workdir: Callable[[str], Path]

    def accepting(self) -> None:
        """Refuse a submission or request where the run only watches its workload."""
        if self.notify is None:
            raise ApiError(409, "this run's jobs come from its workload file: submitting, cancelling and changing "
                                "weights need a service (pollux-opt serve)")

    def job(self, job_id: str) -> dict:
        job = self.store.job(job_id)
        if job is None:
            raise ApiError(404, f"no job {shown(job_id)}")
        return job

    def live_job(self, job_id: str) -> dict:
        job = self.job(job_id)
        if JobState(job["state"]).terminal:
            raise ApiError(409, f"job {job['id']!r} is {job['state']}: an ended job never changes")
        return job


def make_app(store: Store, *, state_dir: Path, notify: Callable[[], None] | None, cluster: Any,
             workdir: Callable[[str], Path] | None = None, token: str | None = None,
             max_body_bytes: int = MAX_BODY_BYTES, registry: CollectorRegistry | None = None) -> FastAPI:
    """The API over ``store`` (see the module docstring).

    Args:
        store: the service's database.
        state_dir: the state directory (its ``events.jsonl`` is streamed).
        notify: called after a submission or request is committed (wakes the scheduler loop);
            None: the run's jobs come from its workload, and the API only watches it (409 for
            submissions, cancels and weights).
        cluster: the cluster's nodes as ``cluster_to_json`` gives them (a list of
            ``{"id", "cpus", "type"?}``), or a dict with them under ``"nodes"``.
        workdir: a job's work directory from its id (default ``state_dir/jobs/<id>``).
        token: the bearer token every route but the public ones (``PUBLIC_PATHS``) needs (None: none).
        max_body_bytes: largest request body, bytes (413 above).
        registry: the Prometheus registry ``/metrics`` shows (default: the store's metrics).
    """
    state_dir = Path(state_dir)
    nodes = tuple(dict(n) for n in (cluster["nodes"] if isinstance(cluster, Mapping) else cluster))
    ctx = _Context(store=store, state_dir=state_dir, notify=notify,
                   workdir=workdir or (lambda job_id: state_dir / "jobs" / job_id))
    if registry is None:
        registry = service_registry(store, sum(int(n["cpus"]) for n in nodes))
    # No redirect of a path with a trailing slash: every answer is the API's JSON.
    app = FastAPI(title="pollux-opt", docs_url=None, redoc_url=None, openapi_url=f"{API}/openapi.json",
                  redirect_slashes=False)
    _add_error_handlers(app)
    _add_job_routes(app, ctx)
    _add_stream_routes(app, ctx)

    @app.get("/healthz")
    def healthz() -> dict:
        return {"status": "ok"}

    add_dashboard_routes(app, store, nodes, api=API)

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    @app.get(f"{API}/cluster")
    def cluster_view() -> dict:
        holders = cpu_holders(store)
        total = sum(int(n["cpus"]) for n in nodes)
        allocated = sum(sum(p.values()) for p in holders.values())
        last = store.last_round()
        return {"nodes": [{"id": n["id"], "cpus": n["cpus"], "type": n.get("type")} for n in nodes],
                "total_cpus": total, "allocated_cpus": allocated, "free_cpus": max(total - allocated, 0),
                "holders": holders, "open_queue": ctx.notify is not None,
                "last_round": None if last is None else {k: last[k] for k in ("t", "objective", "solver_s", "status")}}

    app.add_middleware(_Guard, token=token, max_body_bytes=max_body_bytes)
    return app


# ------------------------------------------------------------------ jobs
def _add_job_routes(app: FastAPI, ctx: _Context) -> None:
    @app.post(f"{API}/jobs", status_code=201)
    def submit(body: JobIn, request: Request) -> JSONResponse:
        key = request.headers.get("idempotency-key")
        if key is not None and not 0 < len(key) <= IDEM_KEY_MAX_CHARS:
            raise InvalidProblem(f"header Idempotency-Key must have 1 to {IDEM_KEY_MAX_CHARS} characters, "
                                 f"got {shown(key)}")
        ctx.accepting()
        fields, spec = _job_fields(body)
        job_id, created = ctx.store.submit(fields, body.name, idem_key=key, progress_target=spec.progress_target,
                                           init_batch_size=spec.init_batch_size)
        if created:
            ctx.notify()
        return JSONResponse({"id": job_id}, status_code=201 if created else 200)

    @app.get(f"{API}/jobs")
    def list_jobs(state: str | None = None) -> Response:
        if state is not None and state not in _STATES:
            raise ApiError(422, f"query.state must be one of {', '.join(_STATES)}, got {shown(state)}")
        # The database's JSON text as it is: no per-job decoding and encoding (most of a long list's time).
        return Response(ctx.store.jobs_json(state), media_type="application/json")

    @app.get(f"{API}/jobs/{{job_id}}")
    def get_job(job_id: str) -> dict:
        return ctx.job(job_id)

    @app.post(f"{API}/jobs/{{job_id}}/cancel", status_code=202)
    def cancel(job_id: str) -> dict:
        ctx.accepting()
        job = ctx.live_job(job_id)
        seq = ctx.store.request(job["id"], "cancel")
        ctx.notify()
        return {"id": job["id"], "request": seq}

    @app.patch(f"{API}/jobs/{{job_id}}")
    def set_weight(job_id: str, body: WeightIn) -> dict:
        weight = check("weight", body.weight, WEIGHT)
        ctx.accepting()
        job = ctx.live_job(job_id)
        seq = ctx.store.request(job["id"], "weight", weight=weight)
        ctx.notify()
        return {"id": job["id"], "request": seq, "weight": weight}


def _job_fields(body: JobIn) -> tuple[dict, Any]:
    """The stored fields of the submission ``body`` (``WorkloadJob.to_json()``
    without ``id`` and ``arrival_s``) and its resolved
    :class:`~pollux_opt.runtime.spec.JobSpec`, once it checks as a workload file's job does.

    Raises:
        InvalidProblem: a bad entry, kind, spec or batch size (the message names the field and value).
    """
    _check_json(body.model_dump())
    fields = body.model_dump(exclude={"name", "kind", "entry", "import_dir", "batch_size"})
    if (body.kind is None) == (body.entry is None):
        raise InvalidProblem(f"give exactly one of kind (a registered job) and entry (script.py:function or "
                             f"package.module:function), got kind={shown(body.kind)} and entry={shown(body.entry)}")
    if body.import_dir is not None and not os.path.isabs(body.import_dir):
        raise InvalidProblem(f"import_dir must be an absolute path, got {shown(body.import_dir)}")
    if body.entry is None and body.import_dir is not None:
        raise InvalidProblem(f"import_dir applies to an entry, not to kind {shown(body.kind)}")
    try:
        if body.entry is None:
            fields["kind"] = body.kind
        else:
            fields.update(_entry_fields(body.entry, body.import_dir))
        job = WorkloadJob.from_json({**fields, "id": _PROBE_ID, "arrival_s": 0.0, "batch_size": body.batch_size or 1})
        spec = _resolve(job)
        if body.batch_size is None:
            job = replace(job, batch_size=spec.init_batch_size)
        Workload(_PROBE_ID, (job,)).check()
    except InvalidProblem:
        raise
    except (TypeError, ValueError, OSError, RecursionError) as exc:  # library code refusing a user's value
        raise InvalidProblem(f"workload job {_PROBE_ID!r}: bad field: {type(exc).__name__}: {exc}") from None
    out = job.to_json()
    del out["id"], out["arrival_s"]
    return out, spec


def _entry_fields(entry: str, import_dir: str | None) -> dict:
    """``entry``, ``import_dir`` and ``kind`` (the name of the entry's module) of an entry's job."""
    target = entry.rpartition(":")[0]
    script = target.endswith(".py")
    if import_dir is None:
        if not (script and os.path.isabs(target)):
            raise InvalidProblem(f"entry {shown(entry)} needs import_dir (an absolute path), or give the script's "
                                 f"absolute path")
        import_dir = os.path.dirname(target)
    module = Path(target).stem if script else target.partition(".")[0]
    kind = re.sub(r"[^A-Za-z0-9._-]", "-", module).lstrip("._-") or "entry"
    return {"entry": entry, "import_dir": import_dir, "kind": kind}


def _resolve(job: WorkloadJob):
    """``job.job_spec()``, a bad spec field as InvalidProblem (as ``Workload.check`` words it)."""
    try:
        return job.job_spec()
    except TypeError as exc:
        raise InvalidProblem(f"workload job {job.id!r}: bad spec field: {exc}") from None


def _check_json(value: Any) -> None:
    """Refuse what the answers could not show: a non-finite number or a string
    that is not UTF-8 (a lone surrogate), anywhere in ``value`` (walked without recursion)."""
    todo = [("body", value)]
    while todo:
        where, v = todo.pop()
        if isinstance(v, float) and not math.isfinite(v):
            raise InvalidProblem(f"{where} must be a finite number, got {v!r}")
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidProblem(f"{where} must be valid UTF-8 text, got {shown(v)}") from None
        elif isinstance(v, dict):
            todo.extend((f"{where} key", k) for k in v)
            todo.extend((f"{where}.{k}" if k.isidentifier() else f"{where}[{shown(k)}]", x) for k, x in v.items())
        elif isinstance(v, list):
            todo.extend((f"{where}[{i}]", x) for i, x in enumerate(v))


# ------------------------------------------------------------------ logs and events
def _add_stream_routes(app: FastAPI, ctx: _Context) -> None:
    @app.get(f"{API}/jobs/{{job_id}}/logs")
    def logs(job_id: str, rank: str = "0", offset: int = Query(0, ge=0, le=MAX_OFFSET),
             follow: bool = False) -> StreamingResponse:
        job = ctx.job(job_id)
        path = ctx.workdir(job["id"]) / "logs" / _log_name(rank)
        if follow:
            body = tail.follow(path, offset, lambda: JobState(ctx.job(job["id"])["state"]).terminal)
            headers = {"X-Log-Offset": str(offset)}
        else:
            end = max(tail.size(path), offset)
            body, headers = tail.read_range(path, offset, end), {"X-Log-Offset": str(end)}
        return StreamingResponse(body, media_type="text/plain; charset=utf-8", headers=headers)

    @app.get(f"{API}/events")
    def events(offset: int | None = Query(None, ge=0, le=MAX_OFFSET),
               last_event_id: str | None = Header(None)) -> StreamingResponse:
        path = ctx.state_dir / EVENTS_FILE
        if last_event_id is not None:
            if not _DIGITS.fullmatch(last_event_id):
                raise ApiError(422, f"header Last-Event-ID must be a byte offset (an event's id), "
                                    f"got {shown(last_event_id)}")
            start = int(last_event_id)
            if start > tail.size(path):  # an id of another run's log (a demo's next run): this one's from its start
                start = 0
        else:
            start = tail.size(path) if offset is None else offset
        return StreamingResponse(tail.event_stream(path, start), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _log_name(rank: str) -> str:
    """The log file of ``rank``: a worker's rank or ``"verify"`` (never a path from the client's text)."""
    if rank == "verify":
        return "verify.log"
    if not _DIGITS.fullmatch(rank) or int(rank) >= MAX_REPLICAS:
        raise ApiError(422, f"query.rank must be a worker's rank (0, 1, ...) or 'verify', got {shown(rank)}")
    return f"worker-rank{int(rank)}.log"


# ------------------------------------------------------------------ errors, token, body limit
def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError) -> str:
    """``"body.weight: Input should be ..., got -1"`` for each of the errors."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ())) or "request"
        if err.get("type") == "json_invalid":  # loc is ("body", character): say what the parser said
            loc = err.get("loc") or ("body", 0)
            parts.append(f"body: not JSON ({(err.get('ctx') or {}).get('error')} at character {loc[-1]})")
            continue
        got = "" if err.get("type") == "missing" else f", got {shown(err.get('input'))}"
        parts.append(f"{where}: {err.get('msg', 'invalid')}{got}")
    return "; ".join(parts) or "invalid request"


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's own errors (no route 404, wrong method 405, the body limit's 413) as JSON."""
    message = str(exc.detail)
    if exc.status_code in (404, 405):
        message = f"{message}: {request.method} {shown(request.url.path)}"
    return _error(exc.status_code, message, exc.headers)


async def _internal(request: Request, exc: Exception) -> JSONResponse:
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return _error(500, f"internal error: {type(exc).__name__} (see the service's log)")


def _add_error_handlers(app: FastAPI) -> None:
    handlers = {ApiError: lambda request, exc: _error(exc.status, exc.message),
                InvalidProblem: lambda request, exc: _error(400, str(exc)),
                RequestValidationError: lambda request, exc: _error(422, _validation_message(exc)),
                HTTPException: _http_error, Exception: _internal}
    for kind, handler in handlers.items():
        app.add_exception_handler(kind, handler)


class _Guard:
    """Pure ASGI middleware run before any route: the bearer token (401) and
    the body limit (413), from ``Content-Length`` and from the bytes actually received."""

    def __init__(self, app: Any, *, token: str | None, max_body_bytes: int) -> None:
        self.app, self.max_body_bytes = app, int(max_body_bytes)
        self.expected = None if token is None else f"Bearer {token}".encode()

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or ())
        path = scope.get("path", "")
        public = path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIX)
        if self.expected is not None and not public and not hmac.compare_digest(
                headers.get(b"authorization", b""), self.expected):
            response = _error(401, "missing or wrong bearer token (header Authorization: Bearer <token>)",
                              {"WWW-Authenticate": "Bearer"})
            return await response(scope, receive, send)
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            status = 413 if length.isdigit() else 400
            message = (f"the request body is larger than {self.max_body_bytes} bytes" if status == 413
                       else f"header Content-Length must be a byte count, got {shown(length.decode('latin-1'))}")
            return await _error(status, message)(scope, receive, send)
        received, started = 0, False

        async def limited_receive() -> dict:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes and not started:
                    raise HTTPException(413, f"the request body is larger than {self.max_body_bytes} bytes")
            return message

        async def watched_send(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, limited_receive, watched_send)
