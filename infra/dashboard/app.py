"""The dashboard's HTTP server: one static page, and the JSON it polls.

- `GET /`: the page (`static/index.html` with `static/dashboard.js`): plain HTML and SVG drawn by the
  script, nothing fetched from elsewhere.
- `GET /api/panels`: every panel of `infra.dashboard.panels`, read from one opening of the store, with
  `refresh_s` (how often the page asks again). A store that cannot be read yet (a live run whose sink has
  not written its first rows) is a 503 with the reason; the page shows it and keeps polling.
- `GET /api/session/{trajectory_id}`: one trajectory's prefix tree with its tokens' policy versions.

The store is opened read-only for each request and closed after it (`open_store(read_only=True)`): a
finished run's chdb folder is read in place, a live one (held by its sink) through a snapshot copy, so the
dashboard never keeps a sink from starting and always sees the rows stored so far. chdb serves one folder
per process at a time, so requests take turns.
"""

from __future__ import annotations

import html
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final, TypeVar

from fastapi import FastAPI, HTTPException
from fastapi.responses import FileResponse, HTMLResponse

from infra.analytics.config import open_store
from infra.analytics.errors import AnalyticsError
from infra.analytics.store import AnalyticsStore
from infra.dashboard import panels
from infra.dashboard.config import DashboardConfig

STATIC: Final = Path(__file__).with_name("static")
T = TypeVar("T")


def finite(value: Any) -> Any:
    """`value` with NaN and infinities as None: JSON has no such numbers (an average over no rows is NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def create_app(config: DashboardConfig) -> FastAPI:
    app = FastAPI(title="SeamlessFlow dashboard", docs_url=None, redoc_url=None)
    one_at_a_time = threading.Lock()
    page = (STATIC / "index.html").read_text().replace("{{title}}", html.escape(config.title))

    @contextmanager
    def reading() -> Iterator[AnalyticsStore]:
        with one_at_a_time:
            try:
                with open_store(config.store, read_only=True) as store:
                    yield store
            except AnalyticsError as e:
                raise HTTPException(503, f"analytics store not readable yet: {' '.join(str(e).split())}") from e

    def read(what: Callable[[AnalyticsStore], T]) -> tuple[T, float]:
        started = time.perf_counter()
        with reading() as store:
            result = what(store)
        return result, round((time.perf_counter() - started) * 1000, 1)

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        return page

    @app.get("/dashboard.js")
    def script() -> FileResponse:
        return FileResponse(STATIC / "dashboard.js", media_type="text/javascript")

    @app.get("/api/panels")
    def all_panels() -> dict[str, Any]:
        data, read_ms = read(lambda store: panels.all_panels(store, config.trajectory_limit))
        return finite({**data, "refresh_s": config.refresh_s, "read_ms": read_ms, "now_ms": int(time.time() * 1000)})

    @app.get("/api/session/{trajectory_id}")
    def session(trajectory_id: str) -> dict[str, Any]:
        tree, _ = read(lambda store: panels.session(store, trajectory_id))
        if tree is None:
            raise HTTPException(404, f"no trajectory {trajectory_id!r} in the store")
        return finite(tree)

    return app

