"""The run page's timeline, laid out: round tick marks, steps of a few milliseconds still
visible and their length said, a phase's `after:` wait, the `duration:` hold and the
cleanup drawn."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from roadie.store.rows import RunRow, StepRow
from roadie.web.timeline import MIN_WIDTH, layout

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _run(**changes: Any) -> RunRow:
    fields: dict[str, Any] = dict(
        id=1, nonce="n", event_id="raid", event_version=1, title="Raid", params={}, status="succeeded",
        cleanup_policy="auto", cleanup_status="complete", phase=1, materialised_phase=1, phase_due_at=None,
        ends_at=None, cancel_requested=False, error=None, created_at=T0, created_by="test", started_at=T0,
        ended_at=_at(10), cleanup_claimed_by=None, cleanup_claim_expires=None, cleanup_attempts=1,
        cleanup_started_at=_at(10.2), cleanup_ended_at=_at(10.9), cleanup_report=None,
        definition={"duration": 10, "phases": [{"name": "muster"}, {"name": "attack", "after": 2}]},
    )  # fmt: skip
    return RunRow(**{**fields, **changes})


def _step(id: int, phase: int, began: float, ended: float, attempts: int = 1) -> StepRow:
    log = [{"attempt": 1, "at": _at(began).isoformat(), "ended": _at(ended).isoformat(), "result": "succeeded"}]
    return StepRow(
        id=id, run_id=1, phase=phase, seq=0, name=f"step {id}", action="sandbox.spawn", owner="sandbox",
        reversible="ledger", lease_ref=None, params={}, idempotency_key=f"k{id}", status="succeeded",
        attempts=attempts, max_attempts=3, retry={}, timeout=30.0, on_error="fail", not_before=T0,
        claimed_by=None, claim_expires=None, created_at=T0, started_at=_at(began), ended_at=_at(ended),
        error=None, output=None, rejections=None, attempt_log=log,
    )  # fmt: skip


def test_a_run_with_a_wait_a_hold_and_a_cleanup_is_drawn_in_full() -> None:
    steps = [_step(1, 0, 0.01, 0.05), _step(2, 1, 2.06, 2.10)]
    t = layout(_run(), steps, now=_at(20))
    assert [k.label for k in t.ticks] == ["0 s", "2 s", "4 s", "6 s", "8 s", "10 s"]
    first = t.rows[0]
    assert first.note == "40 ms"
    assert first.segments[0].width >= MIN_WIDTH  # 40 ms of an 11 s axis is still seen
    [wait] = t.bands[1].waits
    assert wait.title == "after: waited 2.0 s"
    held, cleanup = t.rows[2:]
    assert (held.label, held.note) == ("held (duration)", "7.9 s")
    assert (cleanup.label, cleanup.note) == ("cleanup", "700 ms")
    assert t.span > 10.8


def test_ticks_are_round_for_short_and_long_runs() -> None:
    short = layout(_run(ended_at=_at(0.3), cleanup_started_at=None, cleanup_ended_at=None), [], now=_at(0.3))
    assert [k.label for k in short.ticks][:3] == ["0", "200 ms", "400 ms"]  # spans under a second show 1 s
    long = layout(_run(ended_at=_at(600), cleanup_started_at=None, cleanup_ended_at=None), [], now=_at(600))
    assert [k.label for k in long.ticks] == ["0 min", "2 min", "4 min", "6 min", "8 min", "10 min"]

    weeks = layout(_run(ended_at=_at(86400 * 14), cleanup_started_at=None, cleanup_ended_at=None), [], now=T0)
    assert [k.label for k in weeks.ticks] == ["0 d", "3 d", "6 d", "9 d", "12 d"]  # two weeks
