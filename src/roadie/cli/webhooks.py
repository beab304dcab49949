"""`roadie webhooks`: what was sent to the webhooks of `roadie.toml`, and a test message."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table
from rich.text import Text

from roadie.cli.common import (
    ConfigOption,
    DatabaseOption,
    JsonOption,
    clip,
    console,
    err,
    fail,
    group,
    in_context,
    in_store,
    print_json,
    styled,
)

if TYPE_CHECKING:
    from roadie.runtime import Context

webhooks_app = group("Notifications sent to the webhooks of roadie.toml ([[webhooks]]).")


@webhooks_app.command("list")
def list_deliveries(
    run_id: int | None = typer.Option(None, "--run", metavar="RUN", help="Only what was sent about this run."),
    limit: int = typer.Option(50, "--limit", metavar="N", min=1, max=1000),
    as_json: bool = JsonOption,
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
) -> None:
    """Each notification's delivery to each webhook, newest first: delivered, pending (with
    when it is tried again and why the last attempt failed), skipped or given up."""

    from roadie.store.notify import NotifyQueries

    async def work(store: NotifyQueries) -> list[Any]:
        return await store.list_deliveries(run_id, limit)

    rows = in_store(database_url, config, NotifyQueries, work, as_json=as_json)
    if as_json:
        print_json([asdict(r) for r in rows])
        return
    table = Table("at", "webhook", "what", "run", "state", "attempts", "next / last error")
    for r in rows:
        note = r.last_error or ""
        if r.state == "pending":
            note = f"next {r.next_at:%H:%M:%S}" + (f" · {note}" if note else "")
        table.add_row(
            f"{r.created_at:%Y-%m-%d %H:%M:%S}",
            r.target,
            r.kind,
            str(r.run_id or ""),
            styled(r.state),
            str(r.attempts),
            clip(note, 120),
        )
    console.print(table if rows else "nothing sent yet")


@webhooks_app.command("test")
def send_test(
    name: str = typer.Argument(..., metavar="NAME", help="A webhook's name in roadie.toml."),
    database_url: str | None = DatabaseOption,
    config: str | None = ConfigOption,
) -> None:
    """Send the webhook a message saying Roadie can reach it, and print its answer."""
    import httpx

    async def work(ctx: Context) -> tuple[int, str] | str:
        notifier = ctx.engine.notifier
        if notifier is None or name not in notifier.webhooks:
            known = ", ".join(notifier.webhooks) if notifier else "none"
            return f"no webhook named {name!r} in {ctx.settings.source} (known: {known})"
        try:
            answer = await notifier.send_test(name)
        except TimeoutError:
            return f"{name}: no answer within {notifier.webhooks[name].timeout:g}s"
        except httpx.HTTPError as exc:
            return f"{name}: {type(exc).__name__}: {exc}"
        return answer.status_code, answer.text[:300]

    result = in_context(database_url, config, work)
    if isinstance(result, str):
        fail([result])
    status, text = result
    line = Text(f"{name}: HTTP {status} ") + Text(text)
    if 200 <= status < 300:
        console.print(line)
        return
    err.print(line)
    raise typer.Exit(1)
