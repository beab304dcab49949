"""The ASGI app of `roadie serve`: API, dashboard, metrics, health, and the embedded worker.

The app opens the database, the modules and one engine when it starts (its lifespan),
exactly as every CLI command does, and runs the engine's worker loop beside the
requests unless told not to. Errors are turned into responses in one place,
`_error_response`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from roadie.errors import DefinitionError, InvalidState, NotFound, RoadieError, StoreError
from roadie.remote.gateway import gateway_router
from roadie.runtime import Context, open_context
from roadie.web import api, dashboard
from roadie.web.auth import Forbidden, Unauthenticated, state_of
from roadie.web.live import Broker
from roadie.web.metrics import CONTENT_TYPE, Metrics
from roadie.web.state import WebOptions, WebState

log = structlog.get_logger(__name__)
STATIC = Path(__file__).parent / "static"
ContextOpener = Callable[[WebOptions], AbstractAsyncContextManager[Context]]


def _open(options: WebOptions) -> AbstractAsyncContextManager[Context]:
    return open_context(options.database_url, options.config, concurrency=options.concurrency)


def create_app(options: WebOptions | None = None, *, opener: ContextOpener = _open) -> FastAPI:
    """The app. `opener` builds the store, registry and engine (default: as the CLI does)."""
    options = options or WebOptions()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with opener(options) as ctx:
            metrics, broker = Metrics(), Broker()
            engine = ctx.engine
            earlier = engine.observer

            def observe(kind: str, data: dict[str, Any]) -> None:
                for observer in (earlier, metrics.observe, broker.observe):
                    try:
                        observer(kind, data)
                    except Exception:  # one observer failing must not silence the others
                        log.exception("observer failed", observer=repr(observer))

            engine.observer = observe
            # What remote modules call (docs/protocol.md): the same gateway `roadie gateway` serves.
            app.state.gateway = ctx.gateway()
            state = WebState(options, ctx.store, ctx.registry, engine, engine.clock, metrics, broker)
            app.state.web = state
            if options.worker:
                state.worker_task = asyncio.create_task(engine.run_forever(), name="roadie-worker")
                state.worker_task.add_done_callback(_worker_ended)
            try:
                yield
            finally:
                if state.worker_task is not None:
                    engine.stop()
                    await asyncio.gather(state.worker_task, return_exceptions=True)

    app = FastAPI(
        title="Roadie",
        summary="Run live events against a world other software owns, and take back down what they changed.",
        version="1",
        lifespan=lifespan,
    )
    app.include_router(api.router)
    app.include_router(dashboard.router)
    app.include_router(gateway_router(lambda request: request.app.state.gateway))
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/healthz", tags=["health"])
    async def healthz(request: Request) -> dict[str, Any]:
        """Alive, and the database answers. No token needed."""
        state = state_of(request)
        await state.store.ping()
        task = state.worker_task
        worker = "off" if task is None else ("stopped" if task.done() else "running")
        return {"status": "ok", "worker": worker}

    @app.get("/metrics", tags=["health"], response_class=Response)
    async def metrics(request: Request) -> Response:
        """Prometheus metrics. No token needed: counts only, no names or parameters."""
        state = state_of(request)
        return Response(await state.metrics.render(state.store), media_type=CONTENT_TYPE)

    app.add_exception_handler(RoadieError, _roadie_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    return app


def _worker_ended(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("embedded worker stopped", error=repr(task.exception()))


STATUS: list[tuple[type[RoadieError], int]] = [
    (Unauthenticated, 401),
    (Forbidden, 403),
    (NotFound, 404),
    (InvalidState, 409),
    (DefinitionError, 422),
    (StoreError, 503),
]


def status_of(exc: RoadieError) -> int:
    """The one place a Roadie error becomes an HTTP status."""
    return next((code for cls, code in STATUS if isinstance(exc, cls)), 400)


def _wants_html(request: Request) -> bool:
    return not request.url.path.startswith("/api/") and "text/html" in request.headers.get("accept", "")


async def _roadie_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RoadieError)
    code = status_of(exc)
    if _wants_html(request):
        if code == 401:
            return RedirectResponse("/login", status_code=303)
        return dashboard.error_page(request, code, exc.message)
    body: dict[str, Any] = {"error": exc.message, "field": None}
    if isinstance(exc, DefinitionError):
        body["field"] = exc.problems[0].field if exc.problems else None
        body["problems"] = [p.as_dict() for p in exc.problems]
    headers = {"WWW-Authenticate": "Bearer"} if code == 401 else None
    return JSONResponse(body, status_code=code, headers=headers)


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    first = errors[0] if errors else {}
    field = ".".join(str(p) for p in first.get("loc", ()))
    message = f"{field}: {first.get('msg', 'invalid')}" if field else str(first.get("msg", "invalid request"))
    problems = [{"field": ".".join(str(p) for p in e.get("loc", ())), "message": e.get("msg")} for e in errors]
    return JSONResponse({"error": message, "field": field or None, "problems": problems}, status_code=422)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if _wants_html(request) and exc.status_code == 404:
        return dashboard.error_page(request, 404, "no such page")
    return JSONResponse({"error": str(exc.detail), "field": None}, status_code=exc.status_code, headers=exc.headers)
