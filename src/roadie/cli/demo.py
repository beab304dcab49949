"""`roadie demo`: the bundled invasion, against the sandbox world, with faults switched on.

It proves the one promise Roadie makes: whatever went wrong on the way (an answer lost
after the world was written, calls that failed and were retried), after cleanup the
world is exactly what it was before the run.
"""

from __future__ import annotations

from importlib.resources import files
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from roadie.cli.progress import RunProgress
from roadie.definitions import load_definition
from roadie.modules.sandbox import SandboxWorld
from roadie.runtime import Context, freeze_heap
from roadie.store.dialects import redacted

EXAMPLE = "invasion.yaml"


def world_table(columns: dict[str, dict[str, Any]], *, title: str) -> Table:
    """The world at a glance, one column per snapshot; a value that differs from the
    first column's is highlighted."""
    table = Table(title=title)
    table.add_column("")
    summaries = {name: _summary(snapshot) for name, snapshot in columns.items()}
    for name in summaries:
        table.add_column(name)
    first = next(iter(summaries.values()))
    for key, value in first.items():
        cells = [Text(s.get(key, ""), style="yellow" if s.get(key, "") != value else "") for s in summaries.values()]
        table.add_row(key, *cells)
    return table


def _summary(snapshot: dict[str, Any]) -> dict[str, str]:
    rows = {f"weather · {name}": weather for name, weather in snapshot["regions"].items()}
    rows.update({f"setting · {name}": str(value) or "(empty)" for name, value in snapshot["settings"].items()})
    for group in ("creatures", "items"):
        kinds: dict[str, int] = {}
        for obj in snapshot[group].values():
            label = f"{obj['kind']} in {obj['region']}"
            kinds[label] = kinds.get(label, 0) + 1
        rows[group] = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "none"
    rows["buffs"] = ", ".join(f"{b['name']} in {b['region']}" for b in snapshot["buffs"]) or "none"
    return rows


async def run_demo(ctx: Context, console: Console) -> bool:
    world: SandboxWorld = ctx.registry.state("sandbox")
    text = files("roadie.examples").joinpath(EXAMPLE).read_text()
    definition = load_definition(text, EXAMPLE, ctx.registry)
    event = await ctx.store.create_event_version(
        definition.id,
        definition.title,
        definition.model_dump(mode="json", by_alias=True),
        text,
        "demo",
        ctx.engine.clock.now(),
    )
    title = Text.assemble((definition.title, "bold"), f" — event {definition.id!r} v{event.version}")
    # A rule spans the console's width, which is unbounded when piped: there, a plain line.
    console.rule(title) if console.is_terminal else console.print(title)
    console.print(f"database {redacted(ctx.settings.database_url)}; sandbox world {world.path}")
    before = world.snapshot()

    # The faults: the world applies the first spawn and then loses its answer, and the
    # first two item placements fail before touching anything. Both are retried under
    # the same idempotency key; the world's key ledger makes each effect happen once.
    world.lose_next(1, action="spawn")
    world.fail_next(2, action="place_item", message="sandbox: the shard is busy")
    console.print(
        Text.assemble(
            "faults on: ",
            ("the first spawn's answer is lost", "yellow"),
            ", ",
            ("the first two item placements fail", "yellow"),
        )
    )

    run = await ctx.engine.start_run(event, {}, actor="demo")
    during: dict[str, Any] = {}
    view = RunProgress(console)
    view.watch(run.id, run.definition)

    def observe(kind: str, data: dict[str, Any]) -> None:
        if kind == "cleanup" and data.get("status") == "started":
            during.update(world.snapshot())
        view(kind, data)

    ctx.engine.observer = observe
    freeze_heap()
    with view:
        [ended] = await ctx.engine.settle([run.id])
    world.clear_faults()

    steps = await ctx.store.list_steps(run.id)
    retried = [s for s in steps if s.attempts > 1]
    resources = await ctx.store.list_resources(run.id)
    verdict = str((ended.cleanup_report or {}).get("verdict", "")).replace("_", " ")
    console.print(
        Text.assemble(
            f"run {ended.id} ",
            (ended.status, "bold"),
            f": {len(steps)} steps, {len(retried)} retried "
            f"({', '.join(f'{s.name}: {s.attempts} attempts' for s in retried) or 'none'}); "
            f"{sum(1 for r in resources if r.kind not in ('@step',))} ledger rows; cleanup ",
            (ended.cleanup_status, "bold"),
            f", {verdict}" if verdict else "",
        )
    )
    after = world.snapshot()
    console.print(world_table({"before": before, "during": during or after, "after": after}, title="the world"))
    if after == before:
        console.print(Text("✓ after cleanup the world equals the world before the run.", style="bold green"))
        return ended.status == "succeeded" and ended.cleanup_status == "complete"
    console.print(Text("✗ the world after cleanup differs from the world before the run:", style="bold red"))
    for key in before:
        if before[key] != after[key]:
            console.print(f"  {key}: before {before[key]!r}, after {after[key]!r}")
    return False
