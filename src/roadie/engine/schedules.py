"""Schedules (DESIGN §2): the runs an event's schedule makes by itself.

Every worker looks at every schedule on each tick and makes the runs that are due. Nothing
is held in memory between workers: each run a schedule makes carries the key
`EVENT@OCCURRENCE` (the occurrence in UTC), which the database keeps unique, so however
many workers see an occurrence due at once, it makes one run. The schedule's row in
`schedules` only remembers how far the schedule has got (its newest occurrence made or
skipped), which is what the catch-up policies are judged against after all workers were
down; it moves only forward.

A schedule counts from the moment the event version that brought it was applied: an
hourly cron applied today has no backlog reaching back to the epoch.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Protocol
from zoneinfo import ZoneInfo

from croniter import croniter
from pydantic import ValidationError

from roadie.clock import Clock
from roadie.definitions import CatchUp, ScheduleDef
from roadie.engine import runs
from roadie.engine.base import EngineOptions
from roadie.errors import RoadieError, StoreError
from roadie.log import get_logger
from roadie.registry import Registry
from roadie.store import Store
from roadie.store.rows import EventRow

log = get_logger(__name__)

# With `catch_up: none`, an occurrence still fires when a worker sees it at most this late:
# a tick is never exactly on time, and "on time" should survive a busy worker.
GRACE = timedelta(minutes=1)
# With `catch_up: all`, a long outage is worked off this many runs per event per tick.
BATCH = 100

_TICK = timedelta(microseconds=1)


class Worker(Protocol):
    """What the schedules need of a worker (an `Engine` is one), without importing it."""

    store: Store
    registry: Registry
    clock: Clock
    options: EngineOptions


def schedule_key(event_id: str, occurrence: datetime) -> str:
    """The exactly-once key of one occurrence: the same for every worker that computes it."""
    return f"{event_id}@{occurrence.astimezone(UTC).isoformat()}"


def due_occurrences(schedule: ScheduleDef, last: datetime, now: datetime, *, limit: int = BATCH) -> list[datetime]:
    """The occurrences to make runs for now, oldest first, in UTC.

    `last` is the newest occurrence already made or skipped; only later ones count, and
    none after `now`. Which of those missed occurrences fire is the `catch_up` policy:

    - `all`: every one, oldest first (at most `limit`; the rest on the next tick);
    - `latest`: only the newest one, so an outage of hours makes one run, not dozens;
    - `none`: only the newest one, and only if it is at most `GRACE` old, i.e. it is
      due "now" rather than missed; otherwise nothing fires and the schedule waits for
      its next occurrence.

    In normal operation a worker ticks every poll interval, so the newest occurrence is
    the only one missed and every policy makes the same runs.
    """
    if schedule.catch_up is CatchUp.ALL:
        return list(_take(_forward(schedule, last, now), limit))
    newest = previous_occurrence(schedule, now)
    if newest is None or newest <= last:
        return []
    if schedule.catch_up is CatchUp.NONE and now - newest > GRACE:
        return []
    return [newest]


def previous_occurrence(schedule: ScheduleDef, at: datetime) -> datetime | None:
    """The newest occurrence at or before `at`, in UTC."""
    if schedule.at is not None:
        past = [t for t in _times(schedule) if t <= at]
        return past[-1] if past else None
    assert schedule.cron is not None
    if schedule.until is not None and at > schedule.until:
        at = schedule.until
    if schedule.starts is not None and at < schedule.starts:
        return None
    zone = ZoneInfo(schedule.timezone)
    # croniter's get_prev is strict; one microsecond later makes `at` itself count.
    it = croniter(schedule.cron, (at + _TICK).astimezone(zone))
    while True:
        local: datetime = it.get_prev(datetime)
        if schedule.starts is not None and local < schedule.starts:
            return None
        if not _repeated(schedule.cron, local):
            return local.astimezone(UTC)


def next_occurrence(schedule: ScheduleDef, after: datetime) -> datetime | None:
    """The first occurrence strictly after `after`, in UTC, or None when there is no more."""
    return next(_forward(schedule, after, None), None)


async def create_due_runs(engine: Worker) -> int:
    """Make the runs every schedule has due now; answer how many this worker made.

    Called by every worker on every tick. The runs an event has due are made together by
    `runs.start_runs`, as `Engine.start_runs` makes them (the event's newest version,
    rendered and validated), in one transaction, by actor `schedule`, with the schedule's
    params and each occurrence's key; an occurrence another worker made first is passed
    over. A run that cannot be made (say, its module is not loaded on this
    worker) is logged and left due, for a worker that can, and for the next tick. A run
    that pre-flight finds bound to fail (a setting another run holds) is made, failed with
    the reason, and ends before any step is sent: its occurrence is spent.
    """
    now = engine.clock.now()
    made = 0
    for event, standing in await engine.store.scheduled_events():
        schedule = _schedule_of(event)
        if schedule is None:
            if standing is not None:  # the newest version dropped its schedule: it stops
                await engine.store.forget_schedule(event.event_id)
            continue
        if standing is None:
            standing = await engine.store.start_schedule(event.event_id, min(event.created_at, now), now)
        last = standing.last_occurrence
        due = due_occurrences(schedule, last, now)
        through: datetime | None = None
        failed = False
        if due:
            keys = [schedule_key(event.event_id, occurrence) for occurrence in due]
            try:
                made_runs = await runs.start_runs(
                    engine.store,
                    engine.registry,
                    engine.clock,
                    event,
                    [schedule.params] * len(due),
                    actor="schedule",
                    schedule_keys=keys,
                    in_thread=engine.options.render_in_thread,
                )
            except StoreError:
                raise
            except (RoadieError, ValidationError) as exc:
                # Tried again at every poll (a module may yet announce the action it
                # lacks), but told once per version of the event, in the audit trail.
                error = str(exc)
                told = await engine.store.note_schedule_refusal(event, keys[0], error, now)
                report = log.warning if told else log.debug
                report("scheduled run refused", event_id=event.event_id, schedule_key=keys[0], error=error)
                failed = True
            else:
                through = due[-1]
                for key, run in zip(keys, made_runs, strict=True):
                    if run is not None:
                        made += 1
                        log.info("scheduled run created", event_id=event.event_id, run_id=run.id, schedule_key=key)
        if not failed and not (schedule.catch_up is CatchUp.ALL and len(due) >= BATCH):
            # Everything up to now is made or, by the policy, skipped.
            newest = previous_occurrence(schedule, now)
            if newest is not None and (through is None or newest > through):
                through = newest
        if through is not None and through > last:
            await engine.store.advance_schedule(event.event_id, through, now)
    return made


async def next_due(engine: Worker) -> datetime | None:
    """When the next occurrence of any schedule falls, for the worker to wake then."""
    now = engine.clock.now()
    due: datetime | None = None
    for event, standing in await engine.store.scheduled_events():
        schedule = _schedule_of(event)
        if schedule is None:
            continue
        after = now if standing is None else max(standing.last_occurrence, now)
        candidate = next_occurrence(schedule, after)
        if candidate is not None and (due is None or candidate < due):
            due = candidate
    return due


# -- occurrences -------------------------------------------------------------------------


def _schedule_of(event: EventRow) -> ScheduleDef | None:
    raw = (event.definition or {}).get("schedule")
    if not raw:
        return None
    try:
        return ScheduleDef.model_validate(raw)
    except ValidationError as exc:  # stored by an older Roadie, perhaps: say so, go on
        log.warning("schedule unreadable", event_id=event.event_id, error=str(exc))
        return None


def _times(schedule: ScheduleDef) -> list[datetime]:
    """A one-shot list's times in UTC, sorted, each once, within the bounds."""
    assert schedule.at is not None
    times = sorted({t.astimezone(UTC) for t in schedule.at})
    return [t for t in times if _within(schedule, t)]


def _within(schedule: ScheduleDef, t: datetime) -> bool:
    return (schedule.starts is None or t >= schedule.starts) and (schedule.until is None or t <= schedule.until)


def _forward(schedule: ScheduleDef, after: datetime, upto: datetime | None) -> Iterator[datetime]:
    """Occurrences in (`after`, `upto`] (unbounded above when `upto` is None), in UTC."""
    if schedule.at is not None:
        for t in _times(schedule):
            if t > after and (upto is None or t <= upto):
                yield t
        return
    assert schedule.cron is not None
    if schedule.starts is not None and after < schedule.starts:
        after = schedule.starts - _TICK  # an occurrence exactly at `starts` counts
    it = croniter(schedule.cron, after.astimezone(ZoneInfo(schedule.timezone)))
    while True:
        local: datetime = it.get_next(datetime)
        t = local.astimezone(UTC)
        if (upto is not None and t > upto) or (schedule.until is not None and t > schedule.until):
            return
        if not _repeated(schedule.cron, local):
            yield t


def _repeated(cron: str, local: datetime) -> bool:
    """Whether `local` is the second pass of a wall time the clocks went back over, for
    an expression that names its hours. `30 1 * * *` runs once on the night the clocks go
    back, as an operator reads it; `*/10 * * * *` keeps running every ten real minutes.
    (A wall time the clocks skip forward over is run at the first moment after the gap.)
    """
    if local.replace(fold=0).utcoffset() == local.replace(fold=1).utcoffset():
        return False  # not an ambiguous wall time
    if local.utcoffset() == local.replace(fold=0).utcoffset():
        return False  # the first pass
    hours: list[object] = croniter(cron).expanded[1]
    return hours != ["*"]


def _take(items: Iterator[datetime], limit: int) -> Iterator[datetime]:
    for count, item in enumerate(items):
        if count >= limit:
            return
        yield item
