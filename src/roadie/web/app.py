"""The ASGI app of `roadie serve`: API, dashboard, metrics, health, and the embedded worker.

The app opens the database, the modules and one engine when it starts (its lifespan),
exactly as every CLI command does, and runs the engine's worker loop beside the
requests unless told not to. Errors are turned into responses in one place,
`_error_response`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from roadie.definitions import schema as event_schema
from roadie.errors import DefinitionError, HandedBack, InvalidState, NotFound, RoadieError, StoreError
from roadie.log import get_logger
from roadie.remote.gateway import gateway_router
from roadie.runtime import Context, open_context
from roadie.web import api, bodies, dashboard, streams
from roadie.web.auth import Forbidden, Unauthenticated, identify, state_of
from roadie.web.live import Broker
from roadie.web.metrics import CONTENT_TYPE, Metrics
from roadie.web.outage import PING_TIMEOUT, DatabaseWatch, RefuseWhileDown
from roadie.web.state import WebOptions, WebState

log = get_logger(__name__)
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
            engine.keeps_definitions = options.worker  # the runs it starts are drained elsewhere
            if options.worker:
                state.worker_task = asyncio.create_task(engine.run_forever(), name="roadie-worker")
                state.worker_task.add_done_callback(_worker_ended)
            state.database = DatabaseWatch(ctx.store)
            stop_watching = asyncio.Event()
            watching = asyncio.create_task(state.database.run(stop_watching), name="roadie-database-watch")
            try:
                yield
            finally:
                stop_watching.set()
                try:
                    await asyncio.wait_for(asyncio.shield(watching), PING_TIMEOUT + 1)
                except TimeoutError:
                    watching.cancel()
                await asyncio.gather(watching, return_exceptions=True)
                if state.worker_task is not None:
                    engine.stop()
                    await asyncio.gather(state.worker_task, return_exceptions=True)

    # /docs is Swagger UI served from this process (fastapi-offline's copy), not a CDN.
    app = FastAPIOffline(
        title="Roadie",
        summary="Run live events against a world other software owns, and take back down what they changed.",
        version="1",
        lifespan=lifespan,
        redoc_url=None,
        static_url="/static/api-docs",
    )
    app.add_middleware(bodies.BodyLimit, limit=_body_limits(options), refuse=_too_large)
    app.add_middleware(RefuseWhileDown)  # answers at once while the database is unavailable
    app.add_middleware(SecurityHeaders)  # added last, so outermost: a 413 carries its headers too
    # Routes are matched in turn: the pages' few first (a page would be tried against
    # every API route before them; an API request passes the pages' quickly).
    app.include_router(dashboard.router)
    app.include_router(streams.router)
    app.include_router(api.router)
    app.include_router(gateway_router(lambda request: request.app.state.gateway))
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/healthz", tags=["health"])
    async def healthz(request: Request) -> JSONResponse:
        """Alive, and the database answers: 200 with `{"status": "ok", "worker": ...}`, or
        503 with `"status": "unavailable"` and the database's state (`lost`: its SQLite
        file is gone; `unreachable`: its server does not answer) and why. No token needed."""
        state = state_of(request)
        task = state.worker_task
        worker = "off" if task is None else ("stopped" if task.done() else "running")
        watch = state.database
        if watch is None:  # an app whose lifespan did not run: ask the database itself
            await state.store.ping()
            return JSONResponse({"status": "ok", "worker": worker})
        if watch.down() is None:
            return JSONResponse({"status": "ok", "worker": worker})
        body = {"status": "unavailable", "worker": worker, "database": watch.as_dict()}
        return JSONResponse(body, status_code=503, headers={"Retry-After": "5"})

    @app.get(event_schema.PATH, tags=["events"], response_class=Response)
    async def event_file_schema() -> Response:
        """The JSON Schema of an event file, made from the models: for an editor outside
        Roadie (VS Code's YAML extension). No token needed: it says only the file format."""
        return Response(event_schema.event_schema_json(), media_type="application/schema+json")

    @app.get("/metrics", tags=["health"], response_class=Response)
    async def metrics(request: Request) -> Response:
        """Prometheus metrics. No token needed: counts only, no names or parameters."""
        state = state_of(request)
        return Response(await state.metrics.render(state.store), media_type=CONTENT_TYPE)

    app.add_exception_handler(RoadieError, _roadie_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    return app


# The routes that take an event file: the file (up to `service.MAX_EVENT_BYTES`), and in a
# form the other fields beside it.
EVENT_FILE_ROUTES = frozenset({("POST", "/api/v1/events"), ("POST", "/api/v1/events/check"), ("POST", "/events")})


def _body_limits(options: WebOptions) -> bodies.Limit:
    def limit(method: str, path: str) -> int | None:
        if path.startswith("/roadie/"):
            # The gateway bounds its own bodies (protocol.MAX_BODY_BYTES), after it has
            # checked the request's signature headers and before it reads a byte, and
            # refuses with the protocol's error body.
            return None
        if (method, path) in EVENT_FILE_ROUTES:
            return max(options.max_event_body, options.max_body)
        return options.max_body

    return limit


def _too_large(scope: Scope, limit: int) -> Response:
    request = Request(scope)
    message = f"the request body is larger than {bodies.size(limit)}"
    if _wants_html(request):
        return dashboard.error_page(request, 413, message)
    return JSONResponse({"error": message, "field": None}, status_code=413)


# Every page's scripts and styles are this server's own files; inline style attributes
# (the timeline's bars) are the one exception. Swagger UI's page starts itself with an
# inline script.
POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'"
)
DOCS_POLICY = POLICY.replace("script-src 'self'", "script-src 'self' 'unsafe-inline'")


class SecurityHeaders:
    """The headers every answer carries: no framing, no sniffing, no referrer beyond this
    site, the content policy above, and `no-store` on everything but the static files, so
    that a signed-in page is not kept by the browser (back after signing out shows the
    sign-in page, not the cached one) nor by a proxy. Pure ASGI, so that the live pages'
    event streams pass through untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        policy = DOCS_POLICY if path == "/docs" else POLICY

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers.setdefault("Content-Security-Policy", policy)
                headers.setdefault("X-Frame-Options", "DENY")
                headers.setdefault("X-Content-Type-Options", "nosniff")
                headers.setdefault("Referrer-Policy", "same-origin")
                if not path.startswith("/static/"):
                    headers.setdefault("Cache-Control", "no-store")
            await send(message)

        await self.app(scope, receive, with_headers)


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
    (HandedBack, 503),  # the server is stopping: a cleanup asked of it now is given back
]


def status_of(exc: RoadieError) -> int:
    """The one place a Roadie error becomes an HTTP status."""
    return next((code for cls, code in STATUS if isinstance(exc, cls)), 400)


def _wants_html(request: Request) -> bool:
    return not request.url.path.startswith("/api/") and "text/html" in request.headers.get("accept", "")


async def _roadie_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RoadieError)
    code = status_of(exc)
    if isinstance(exc, StoreError):
        web = getattr(request.app.state, "web", None)
        if web is not None and web.database is not None:
            web.database.failed(exc)  # the next request is answered at once
    if _wants_html(request):
        if code == 401:
            return RedirectResponse(dashboard.login_address(request), status_code=303)
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
    if _wants_html(request):
        # /runs/abc in a browser: a page that names what is wrong, not the API's JSON.
        in_path = bool(first.get("loc")) and first["loc"][0] == "path"
        return dashboard.error_page(request, 404 if in_path else 422, "no such page" if in_path else message)
    not_json = _not_json(request, first)
    if not_json is not None:
        return JSONResponse({"error": not_json, "field": "body"}, status_code=400)
    problems = [{"field": ".".join(str(p) for p in e.get("loc", ())), "message": e.get("msg")} for e in errors]
    return JSONResponse({"error": message, "field": field or None, "problems": problems}, status_code=422)


def _not_json(request: Request, error: Any) -> str | None:
    """Why a body is not JSON (400), or None when it is and the mistake is in what it says (422)."""
    loc = tuple(error.get("loc", ()))
    if error.get("type") == "json_invalid":
        reason = (error.get("ctx") or {}).get("error", "invalid")
        at = f" at character {loc[1]}" if len(loc) > 1 else ""
        return f"the body is not JSON: {reason}{at}"
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if (
        loc == ("body",)
        and error.get("type") != "missing"
        and not (kind == "application/json" or kind.endswith("+json"))
    ):
        # FastAPI reads a body as JSON only when it says it is: any other is taken as text.
        sent = f"not {kind}" if kind else "it had none"
        return f"the body is not JSON: send it with Content-Type: application/json ({sent})"
    return None


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if _wants_html(request) and exc.status_code == 404:
        # No route ran, so nothing asked who is calling: ask, so that a signed-in
        # viewer's 404 page has the site's header and navigation like any other page.
        # A database that does not answer leaves the page without them.
        with contextlib.suppress(RoadieError):
            request.state.principal = await identify(request)
        return dashboard.error_page(request, 404, "no such page")
    return JSONResponse({"error": str(exc.detail), "field": None}, status_code=exc.status_code, headers=exc.headers)
