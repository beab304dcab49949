"""Which occurrences of a schedule are due (`due_occurrences`): the catch-up policies,
bounds, one-shot lists and the two nights a year the clocks change."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from roadie.definitions import ScheduleDef
from roadie.engine.schedules import GRACE, due_occurrences, next_occurrence

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def cron(expression: str, **more: Any) -> ScheduleDef:
    return ScheduleDef.model_validate({"cron": expression, **more})


def test_catch_up_policies_after_an_outage() -> None:
    """Three hours missed of `*/10`: `all` answers all 18 in order, `latest` only 03:00,
    `none` nothing once 03:00 is older than the grace, and 03:00 itself while it is not."""
    now = T0 + timedelta(hours=3, minutes=5)
    missed = [T0 + timedelta(minutes=10 * n) for n in range(1, 19)]
    assert due_occurrences(cron("*/10 * * * *", catch_up="all"), T0, now) == missed
    assert due_occurrences(cron("*/10 * * * *", catch_up="all"), T0, now, limit=5) == missed[:5]
    assert due_occurrences(cron("*/10 * * * *"), T0, now) == [missed[-1]]
    assert due_occurrences(cron("*/10 * * * *", catch_up="none"), T0, now) == []
    on_time = missed[-1] + GRACE
    assert due_occurrences(cron("*/10 * * * *", catch_up="none"), T0, on_time) == [missed[-1]]


def test_nothing_is_due_twice_or_early() -> None:
    """An occurrence at or before `last` is never answered again, nor one after `now`."""
    schedule = cron("*/10 * * * *", catch_up="all")
    at = T0 + timedelta(minutes=10)
    assert due_occurrences(schedule, at, at) == []
    assert due_occurrences(schedule, at - timedelta(microseconds=1), at) == [at]
    assert due_occurrences(schedule, T0, at - timedelta(seconds=1)) == []


def test_starts_and_until_bound_the_occurrences() -> None:
    """`starts` (inclusive) and `until` (inclusive) keep every occurrence inside them."""
    schedule = cron("0 * * * *", catch_up="all", starts=T0 + timedelta(hours=2), until=T0 + timedelta(hours=4))
    got = due_occurrences(schedule, T0, T0 + timedelta(days=1))
    assert got == [T0 + timedelta(hours=h) for h in (2, 3, 4)]
    assert next_occurrence(schedule, T0 + timedelta(hours=4)) is None
    assert due_occurrences(cron("0 * * * *", until=T0 + timedelta(hours=4)), T0, T0 + timedelta(days=1)) == [
        T0 + timedelta(hours=4)
    ]


def test_one_shot_times_in_any_offset() -> None:
    """An `at:` list is read in UTC, sorted, each time once."""
    schedule = ScheduleDef.model_validate(
        {"at": ["2026-01-01T02:00:00+01:00", "2026-01-01T00:30:00Z", "2026-01-01T01:00:00+00:00"], "catch_up": "all"}
    )
    got = due_occurrences(schedule, T0, T0 + timedelta(hours=2))
    assert got == [T0 + timedelta(minutes=30), T0 + timedelta(hours=1)]
    assert next_occurrence(schedule, T0 + timedelta(hours=1)) is None


def test_the_night_the_clocks_go_back() -> None:
    """On 2026-10-25 London repeats 01:00-02:00: `30 1 * * *` fires once (at the first
    01:30), while `*/30 * * * *` keeps firing every real half hour through both passes."""
    london = {"timezone": "Europe/London", "catch_up": "all"}
    start, end = datetime(2026, 10, 24, 12, tzinfo=UTC), datetime(2026, 10, 26, 12, tzinfo=UTC)
    daily = due_occurrences(cron("30 1 * * *", **london), start, end)
    assert daily == [datetime(2026, 10, 25, 0, 30, tzinfo=UTC), datetime(2026, 10, 26, 1, 30, tzinfo=UTC)]
    evening = datetime(2026, 10, 24, 23, 45, tzinfo=UTC)
    night = due_occurrences(cron("*/30 * * * *", **london), evening, datetime(2026, 10, 25, 2, tzinfo=UTC))
    assert night == [evening + timedelta(minutes=15 + 30 * n) for n in range(5)]


def test_the_night_the_clocks_go_forward() -> None:
    """On 2026-03-29 London skips 01:00-02:00: `30 1 * * *` fires at the first moment after
    the gap (02:00 BST, 01:00 UTC), once."""
    london = {"timezone": "Europe/London", "catch_up": "all"}
    got = due_occurrences(
        cron("30 1 * * *", **london), datetime(2026, 3, 28, 12, tzinfo=UTC), datetime(2026, 3, 30, 12, tzinfo=UTC)
    )
    assert got == [datetime(2026, 3, 29, 1, tzinfo=UTC), datetime(2026, 3, 30, 0, 30, tzinfo=UTC)]
