"""Schedules (DESIGN §2): runs made by a cron or a list of one-shot times, exactly once per
occurrence however many workers are alive, with a stated policy for what was missed while
every worker was down."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from tests.conftest import Harness

from roadie.engine import Engine, EngineOptions
from roadie.registry import Registry
from roadie.store import Store
from roadie.store.rows import RunRow

T0 = datetime(2026, 1, 1, tzinfo=UTC)  # the harness's FakeClock starts here


def scheduled_event(schedule: str, *, event_id: str = "patrol") -> str:
    return f"""
id: {event_id}
params:
  wave: {{type: int, default: 1}}
schedule:
{schedule}
phases:
  - name: only
    steps:
      - action: core.log
        with: {{message: "wave {{{{ wave }}}}"}}
"""


@contextlib.asynccontextmanager
async def workers(harness: Harness, count: int) -> AsyncIterator[list[Engine]]:
    """`count` workers on the harness's database: each its own Store (own connections) and
    worker id, all on the harness's one FakeClock and registry."""
    stores = [await Store.open(harness.database_url) for _ in range(count)]
    try:
        yield [
            Engine(store, harness.registry, clock=harness.clock, worker_id=f"w{i}", options=EngineOptions(seed=i))
            for i, store in enumerate(stores)
        ]
    finally:
        for store in stores:
            await store.close()


async def all_runs(harness: Harness) -> list[RunRow]:
    return sorted(await harness.store.list_runs(limit=10_000), key=lambda r: r.id)


def keys(runs: list[RunRow]) -> list[str]:
    return sorted(r.schedule_key or "" for r in runs)


def key(event_id: str, at: datetime) -> str:
    return f"{event_id}@{at.astimezone(UTC).isoformat()}"


def test_three_workers_make_each_cron_occurrence_exactly_once(harness: Harness) -> None:
    """Three workers (three stores, one clock) ticking in random orders, and often all at
    once, through a simulated hour of `*/10 * * * *`: exactly the six occurrences after
    the event was applied make runs, none twice, each with the schedule's params, and
    every run is carried out."""
    event = scheduled_event("  cron: '*/10 * * * *'\n  params: {wave: 2}")

    async def body() -> None:
        await harness.apply(event)
        rng = random.Random(20260101)
        end = T0 + timedelta(hours=1)
        async with workers(harness, 3) as engines:
            while harness.clock.now() < end:
                harness.clock.set(min(end, harness.clock.now() + timedelta(seconds=rng.randint(1, 150))))
                order = rng.sample(engines, k=len(engines))
                if rng.random() < 0.4:
                    await asyncio.gather(*(e.tick() for e in order))
                else:
                    for e in order[: rng.randint(1, 3)]:
                        await e.tick()
            await asyncio.gather(*(e.tick() for e in engines))
            await asyncio.gather(*(e.tick() for e in engines))

        runs = await all_runs(harness)
        expected = [key("patrol", T0 + timedelta(minutes=10 * n)) for n in range(1, 7)]
        assert keys(runs) == expected
        assert len({r.schedule_key for r in runs}) == len(runs) == 6
        assert {(r.created_by, r.status) for r in runs} == {("schedule", "succeeded")}
        assert all(r.params == {"wave": 2} for r in runs)

    harness.run(body)


def test_two_workers_racing_one_occurrence_make_one_run(harness: Harness) -> None:
    """The key is the database's, not a lock in a worker's memory: two workers ticking at
    the same instant on each occurrence, and two `start_run`s of one key side by side,
    make one run per occurrence; the loser is told the run exists (None)."""
    event = scheduled_event("  cron: '*/5 * * * *'")

    async def body() -> None:
        row = await harness.apply(event)
        async with workers(harness, 2) as (a, b):
            for n in range(1, 5):
                harness.clock.set(T0 + timedelta(minutes=5 * n))
                await asyncio.gather(a.tick(), b.tick())
            k = key("patrol", T0 + timedelta(minutes=99))
            made = await asyncio.gather(
                a.start_run(row, {}, actor="schedule", schedule_key=k),
                b.start_run(row, {}, actor="schedule", schedule_key=k),
            )
        runs = await all_runs(harness)
        assert len(runs) == 5
        assert len({r.schedule_key for r in runs}) == 5
        assert sorted(r is None for r in made) == [False, True]

    harness.run(body)


def test_one_shot_times_each_make_one_run_when_due(harness: Harness) -> None:
    """An `at:` list fires each time once, whatever its offset, and nothing else: the
    worker's tick answers the next time as due, so a worker that sleeps until then (here,
    the clock jumping to each answer) makes each run at its very moment."""
    times = ["2026-01-01T00:05:00Z", "2026-01-01T01:20:00+01:00", "2026-01-01T02:00:00Z"]
    event = scheduled_event(f"  at: [{', '.join(times)}]")

    async def body() -> None:
        await harness.apply(event)
        for _ in range(100):
            due = await harness.engine.tick()
            if due is None:
                break
            harness.clock.set(max(due, harness.clock.now()))
        runs = await all_runs(harness)
        wanted = [T0 + timedelta(minutes=5), T0 + timedelta(minutes=20), T0 + timedelta(hours=2)]
        assert [r.created_at for r in runs] == wanted
        assert keys(runs) == [key("patrol", t) for t in wanted]
        assert due is None  # no occurrence left, and nothing else due

    harness.run(body)


@pytest.mark.parametrize(
    ("policy", "after_outage", "at_next"),
    [
        ("all", [T0 + timedelta(minutes=10 * n) for n in range(1, 19)], [T0 + timedelta(hours=3, minutes=10)]),
        ("latest", [T0 + timedelta(hours=3)], [T0 + timedelta(hours=3, minutes=10)]),
        ("none", [], [T0 + timedelta(hours=3, minutes=10)]),
    ],
)
def test_catch_up_after_every_worker_was_down(
    harness: Harness, policy: str, after_outage: list[datetime], at_next: list[datetime]
) -> None:
    """Every worker is down from 00:00 to 03:05 under `*/10 * * * *`: on the first tick
    after, `all` makes the 18 missed runs, `latest` makes one for 03:00, `none` makes none;
    at 03:10 each policy is on time again and makes that occurrence's run."""
    event = scheduled_event(f"  cron: '*/10 * * * *'\n  catch_up: {policy}")

    async def body() -> None:
        await harness.apply(event)
        await harness.engine.tick()
        harness.clock.advance(3 * 3600 + 5 * 60)  # everyone down: no tick
        await harness.engine.tick()
        assert keys(await all_runs(harness)) == [key("patrol", t) for t in after_outage]
        harness.clock.set(T0 + timedelta(hours=3, minutes=10))
        await harness.engine.tick()
        assert keys(await all_runs(harness)) == [key("patrol", t) for t in after_outage + at_next]

    harness.run(body)


def test_a_schedule_counts_from_when_it_was_applied(harness: Harness) -> None:
    """An hourly cron with `catch_up: all` applied at 00:30 has no backlog from before then,
    even when no worker sees it until 03:00 (the runs of 01:00, 02:00 and 03:00, no more)."""
    event = scheduled_event("  cron: '0 * * * *'\n  catch_up: all")

    async def body() -> None:
        harness.clock.set(T0 + timedelta(minutes=30))
        await harness.apply(event)
        await harness.engine.tick()
        assert await all_runs(harness) == []
        harness.clock.set(T0 + timedelta(hours=3))
        await harness.engine.tick()
        assert keys(await all_runs(harness)) == [key("patrol", T0 + timedelta(hours=h)) for h in (1, 2, 3)]

    harness.run(body)


def test_a_cron_in_a_time_zone_follows_its_clocks_across_dst(harness: Harness) -> None:
    """`0 9 * * *` in Europe/London is 09:00 UTC before the clocks go forward on
    2026-03-29 and 08:00 UTC after: the worker wakes for each (the tick answers it as due)
    and makes one run a day."""
    event = scheduled_event("  cron: '0 9 * * *'\n  timezone: Europe/London")

    async def body() -> None:
        harness.clock.set(datetime(2026, 3, 27, 12, tzinfo=UTC))
        await harness.apply(event)
        end = datetime(2026, 3, 31, 12, tzinfo=UTC)
        for _ in range(200):
            due = await harness.engine.tick()
            assert due is not None
            if due > end:
                break
            harness.clock.set(max(due, harness.clock.now()))
        runs = await all_runs(harness)
        wanted = [
            datetime(2026, 3, 28, 9, tzinfo=UTC),
            datetime(2026, 3, 29, 8, tzinfo=UTC),
            datetime(2026, 3, 30, 8, tzinfo=UTC),
            datetime(2026, 3, 31, 8, tzinfo=UTC),
        ]
        assert [r.created_at for r in runs] == wanted
        assert keys(runs) == [key("patrol", t) for t in wanted]

    harness.run(body)


def test_a_version_without_a_schedule_stops_it_and_a_new_one_starts_afresh(harness: Harness) -> None:
    """Applying the event without `schedule:` stops its runs; putting a schedule back later
    (even with `catch_up: all`) starts from then, not from where the old one stopped."""
    with_schedule = scheduled_event("  cron: '*/10 * * * *'\n  catch_up: all")
    without = with_schedule.replace("schedule:\n  cron: '*/10 * * * *'\n  catch_up: all\n", "")

    async def body() -> None:
        await harness.apply(with_schedule)
        harness.clock.set(T0 + timedelta(minutes=10))
        await harness.engine.tick()
        harness.clock.set(T0 + timedelta(minutes=15))
        await harness.apply(without)
        for minutes in (20, 30, 60):
            harness.clock.set(T0 + timedelta(minutes=minutes))
            await harness.engine.tick()
        assert keys(await all_runs(harness)) == [key("patrol", T0 + timedelta(minutes=10))]
        harness.clock.set(T0 + timedelta(minutes=65))
        await harness.apply(with_schedule)
        await harness.engine.tick()
        harness.clock.set(T0 + timedelta(minutes=70))
        await harness.engine.tick()
        assert keys(await all_runs(harness)) == [key("patrol", T0 + timedelta(minutes=m)) for m in (10, 70)]

    harness.run(body)


def test_a_run_that_cannot_be_made_is_left_due_for_a_worker_that_can(harness: Harness) -> None:
    """A worker that cannot render the scheduled run (the step's module is not loaded
    there) goes on with its tick and leaves the occurrence due; a worker that has the
    module makes the run, a little late, rather than never."""
    event = scheduled_event("  cron: '*/10 * * * *'")

    async def body() -> None:
        await harness.apply(event)
        async with workers(harness, 1) as [able]:
            bare = Engine(able.store, Registry(harness.clock), clock=harness.clock, worker_id="bare")
            harness.clock.set(T0 + timedelta(minutes=10))
            await bare.tick()
            assert await all_runs(harness) == []
            harness.clock.set(T0 + timedelta(minutes=12))
            await able.tick()
        assert keys(await all_runs(harness)) == [key("patrol", T0 + timedelta(minutes=10))]

    harness.run(body)


def test_a_refused_scheduled_run_is_told_once_per_version_not_at_every_poll(harness: Harness) -> None:
    """A worker that cannot start the scheduled run tries again at every poll, but the
    refusal is written to the audit trail once for the event's version, whichever worker
    meets it; a new version that is still refused is told once more."""
    event = scheduled_event("  cron: '*/10 * * * *'")

    async def refusals() -> list[dict[str, object]]:
        rows = await harness.store.list_audit(subject="event:patrol")
        return [r.detail for r in rows if r.action == "schedule.refused"]

    async def body() -> None:
        await harness.apply(event)
        bare = [
            Engine(harness.store, Registry(harness.clock), clock=harness.clock, worker_id=f"bare{i}") for i in (1, 2)
        ]
        harness.clock.set(T0 + timedelta(minutes=10))
        for _ in range(3):
            for worker in bare:
                await worker.tick()
        [told] = await refusals()
        assert (told["version"], told["schedule_key"]) == (1, key("patrol", T0 + timedelta(minutes=10)))
        assert "core.log" in str(told["error"])
        await harness.apply(event.replace("wave", "round"))
        harness.clock.advance(1)
        for worker in bare:
            await worker.tick()
        assert [t["version"] for t in await refusals()] == [2, 1]
        await harness.engine.tick()
        assert keys(await all_runs(harness)) == [key("patrol", T0 + timedelta(minutes=10))]

    harness.run(body)
