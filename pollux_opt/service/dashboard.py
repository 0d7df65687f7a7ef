"""The dashboard's routes: the page at ``/`` (static files in ``static/``, no
build step) and the charts it shows, drawn as SVG here (:mod:`~pollux_opt.service.charts`)."""

from __future__ import annotations

import time
from pathlib import Path

from fastapi import FastAPI, Query
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles

from pollux_opt.model.domains import shown
from pollux_opt.service.charts import CHARTS, JOB_CHARTS, JOB_ONLY, chart_series, render_svg
from pollux_opt.service.db import Store
from pollux_opt.service.errors import ApiError

__all__ = ["STATIC_DIR", "add_dashboard_routes"]

#: The dashboard's files (``/`` and ``/static/...``): public, as they hold no data (the page sends the token).
STATIC_DIR = Path(__file__).with_name("static")
#: Largest offset of a viewer's time zone from UTC, seconds (UTC+14).
MAX_TZ_OFFSET_S = 14 * 3600


def add_dashboard_routes(app: FastAPI, store: Store, nodes: tuple[dict, ...], *, api: str) -> None:
    """The page at ``/``, its files under ``/static/`` and its charts at
    ``{api}/charts/{name}[?job=ID&tz=S]`` (``nodes``: the cluster's, for its CPUs)."""

    @app.get("/")
    def dashboard() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get(f"{api}/charts/{{name}}")
    def chart(name: str, tz: int = Query(0, ge=-MAX_TZ_OFFSET_S, le=MAX_TZ_OFFSET_S),
              job: str | None = None) -> Response:
        if name not in CHARTS:
            raise ApiError(404, f"no chart {shown(name)}: the charts are {', '.join(CHARTS)}")
        if job is None and name in JOB_ONLY:
            raise ApiError(422, f"chart {shown(name)} shows one job: give query.job")
        if job is not None:
            if name not in JOB_CHARTS:
                raise ApiError(422, f"query.job applies to the charts {', '.join(JOB_CHARTS)}, not {shown(name)}")
            if store.job(job) is None:
                raise ApiError(404, f"no job {shown(job)}")
        series = chart_series(name, store.history(), total_cpus=sum(int(n["cpus"]) for n in nodes), job=job)
        if name == "efficiency":  # over batch sizes, not time
            start, end = min((min(s.xs) for s in series), default=0.0), max((max(s.xs) for s in series), default=1.0)
        else:
            end = time.time()
            start = min((s.xs[0] for s in series if s.xs), default=end - 60.0)
        return Response(render_svg(name, series, start=start, end=end, tz_offset_s=tz),
                        media_type="image/svg+xml", headers={"Cache-Control": "no-cache"})
