"""`roadie sandbox serve`: the sandbox world as a remote module server in its own process,
with fault knobs on the wire (DESIGN §7); and the signed world view `sandbox show --url`
reads."""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import typer

from roadie.cli.common import require_web

WORLD_PATH = "/sandbox/v1/world"
SecretOption = typer.Option(
    None,
    "--secret",
    envvar="ROADIE_SANDBOX_SECRET",
    help="Shared secret (env ROADIE_SANDBOX_SECRET).",
    show_default=False,
)


def default_ledger(db: str) -> str:
    """The key ledger next to the world file: `world.db` -> `world-keys.db`."""
    path = Path(db)
    return str(path.with_name(f"{path.stem}-keys{path.suffix or '.db'}"))


def _views() -> dict[str, Any]:
    return {WORLD_PATH: lambda world: world.snapshot()}


def _fail(message: str) -> typer.Exit:
    sys.stderr.write(f"error: {message}\n")
    return typer.Exit(2)


def serve(
    port: int = typer.Option(7300, "--port", help="Port to listen on (0: any free port, printed when ready)."),
    db: str = typer.Option(..., "--db", metavar="FILE", help="The world's SQLite file (created and seeded if new)."),
    secret: str | None = SecretOption,
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to listen on."),
    ledger: str | None = typer.Option(
        None, "--ledger", metavar="FILE", help="The key ledger's file (default: next to --db)."
    ),
    lose_answers: float = typer.Option(
        0.0, "--lose-answers", metavar="P", help="Probability that a dispatch is carried out but its answer dropped."
    ),
    fail_first: int = typer.Option(
        0, "--fail-first", metavar="N", help="The first N dispatches answer 503 before acting."
    ),
    delay: str = typer.Option("0s", "--delay", metavar="DURATION", help="Wait this long before every call, e.g. 50ms."),
    pull: str | None = typer.Option(
        None, "--pull", metavar="URL", help="Poll this engine gateway instead of listening."
    ),
    seed: int | None = typer.Option(None, "--seed", metavar="N", help="Seed of the --lose-answers dice."),
) -> None:
    """Serve the sandbox world over the remote protocol (push), or poll an engine (--pull)."""
    require_web("sandbox serve")
    import asyncio

    from roadie.durations import parse_duration
    from roadie.modules.sandbox import module
    from roadie.plugin import Faults

    if not secret:
        raise _fail("a shared secret is required: --secret or ROADIE_SANDBOX_SECRET")
    try:
        faults = Faults(fail_first=fail_first, lose_answers=lose_answers, delay=parse_duration(delay), seed=seed)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    db_path = os.path.abspath(db)
    ledger_path = os.path.abspath(ledger or default_ledger(db_path))
    common: dict[str, Any] = {
        "secret": secret,
        "ledger_path": ledger_path,
        "settings": {"db": db_path},
        "faults": faults,
        "views": _views(),
    }
    if pull:
        asyncio.run(_pull(module, pull, common))
    else:
        asyncio.run(_listen(module, host, port, common))


async def _listen(module: Any, host: str, port: int, common: dict[str, Any]) -> None:
    import asyncio

    import uvicorn

    from roadie.plugin import ModuleServer

    server = ModuleServer(module, **common)
    # uvicorn logs a traceback for every answer dropped on purpose; that is the knob working.
    logging.getLogger("uvicorn.error").addFilter(_NotDropped())
    config = uvicorn.Config(server.app(), host=host, port=port, log_level="warning", access_log=False, lifespan="on")
    web = uvicorn.Server(config)
    serving = asyncio.create_task(web.serve())
    while not web.started:
        if serving.done():
            await serving  # it failed to start: its error, or its exit
            raise typer.Exit(1)
        await asyncio.sleep(0.02)
    bound = web.servers[0].sockets[0].getsockname()[1] if web.servers else port
    sys.stdout.write(f"sandbox serving on http://{host}:{bound}\n")
    sys.stdout.flush()
    await serving


async def _pull(module: Any, engine_url: str, common: dict[str, Any]) -> None:
    import asyncio

    from roadie.errors import RoadieError
    from roadie.plugin import PullClient

    rest = {k: v for k, v in common.items() if k not in ("secret", "ledger_path")}
    client = PullClient(module, engine_url, common["secret"], common["ledger_path"], **rest)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, client.stop)
    running = asyncio.create_task(client.run())
    announced = asyncio.create_task(client.announced.wait())
    await asyncio.wait({running, announced}, return_when=asyncio.FIRST_COMPLETED)
    if announced.done():
        sys.stdout.write(f"sandbox pulling from {engine_url.rstrip('/')}\n")
        sys.stdout.flush()
    else:
        announced.cancel()
    try:
        await running
    except RoadieError as exc:
        raise _fail(exc.message) from None


class _NotDropped(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        from roadie.plugin import AnswerDropped

        return not (record.exc_info and isinstance(record.exc_info[1], AnswerDropped))


def fetch_world(url: str, secret: str) -> dict[str, Any]:
    """The world snapshot of a `roadie sandbox serve` at `url`, by its signed view."""
    import httpx

    from roadie import protocol
    from roadie.errors import RoadieError

    headers = protocol.sign(secret, "GET", WORLD_PATH, b"")
    try:
        response = httpx.get(url.rstrip("/") + WORLD_PATH, headers=headers, timeout=10.0)
    except httpx.TransportError as exc:
        raise RoadieError(f"cannot reach the sandbox at {url}: {exc}") from exc
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code != 200 or not isinstance(body, dict):
        detail = body.get("error", {}).get("message") if isinstance(body, dict) else response.text[:200]
        raise RoadieError(f"the sandbox at {url} answered HTTP {response.status_code}: {detail}")
    return body
