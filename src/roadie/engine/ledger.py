"""The ledger's write half: turning a module's answer into rows, or into reasons why not.

Every failure here is the module's mistake, not the world's, so none becomes a retry: a
badly shaped resource is just as badly shaped on the second attempt. Each is dropped with
its reason, and the step still counts as done, because it is done (DESIGN §4 rule 4).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from roadie.registry import Answer, Registry
from roadie.states import LEASE_KINDS, STEP_KIND
from roadie.store import NewResource
from roadie.store.json_text import json_dumps

MAX_KIND = 64
MAX_REF = 190
MAX_MEMBER_KEY = 190


@dataclass
class ReadAnswer:
    """A module's answer as the ledger reads it."""

    resources: list[NewResource] = field(default_factory=list)
    rejections: list[str] = field(default_factory=list)
    output: Any = None
    # False when the answer itself could not be read: then nobody knows what the step
    # made, so its placeholder stays pending and cleanup reverts by key alone.
    readable: bool = True


def normalise(entry: Any, action_id: str, registry: Registry) -> NewResource | str:
    """One entry of an answer's `resources` as a row, or the reason it is refused.

    Over-long values are refused, never truncated: a truncated ref is a cleanup call
    naming the wrong object.
    """
    if not isinstance(entry, dict):
        return f"{action_id} reported a resource that is not an object: {entry!r:.80}"
    raw_kind, raw_ref = entry.get("kind"), entry.get("ref")
    kind = "" if raw_kind is None else str(raw_kind)
    ref = "" if raw_ref is None else str(raw_ref)
    if not kind or len(kind) > MAX_KIND:
        return f"{action_id} reported a resource with a bad kind {raw_kind!r:.80}"
    if kind in (STEP_KIND, *LEASE_KINDS):
        # Core's own. A module that could write a placeholder could make its step's look
        # resolved; one that could write an override would hold a lease target under its
        # own name, beside core's row for it, with no saved value to give back.
        return f"{action_id} reported a resource of the reserved kind {kind!r}"
    if not ref or len(ref) > MAX_REF:
        return f"{action_id} reported a resource with a bad ref {raw_ref!r:.80}"
    member_key = entry.get("memberKey", entry.get("member_key"))
    if member_key is not None:
        member_key = str(member_key)
        if len(member_key) > MAX_MEMBER_KEY:
            return f"{action_id} reported a resource with an over-long memberKey"
    until = None
    if entry.get("until") is not None:
        until = _parse_until(entry["until"])
        if until is None:
            return f"{action_id} reported a resource with a bad until {entry['until']!r:.80}"
    payload = entry.get("payload")
    if not storable(payload):
        return f"{action_id} reported a resource whose payload is not JSON: {payload!r:.80}"
    return NewResource(kind=kind, ref=ref, payload=payload, until=until, member_key=member_key)


def storable(value: Any) -> bool:
    """Whether every database can keep `value` in a JSON column. Checked here, because a
    value the database refuses would fail the whole batch being recorded: a ledger that
    throws (DESIGN §4 rule 5)."""
    try:
        json_dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return False
    return True


def _parse_until(value: Any) -> datetime | None:
    try:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return datetime.fromtimestamp(value, UTC)
        if isinstance(value, str):
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    except (ValueError, OverflowError, OSError):
        return None
    return None


def read_answer(raw: Any, action_id: str, *, ledgered: bool, registry: Registry) -> ReadAnswer:
    """Read what an action returned: `None`, a list of resources, an `Answer`, or a mapping
    with `resources` and `output` (what a remote module sends)."""
    if raw is None:
        return ReadAnswer()
    entries: Any
    if isinstance(raw, Answer):
        entries, output = raw.resources or [], raw.output
    elif isinstance(raw, list):
        entries, output = raw, None
    elif isinstance(raw, dict) and set(raw) <= {"resources", "output"}:
        entries, output = raw.get("resources") or [], raw.get("output")
    else:
        return ReadAnswer(
            rejections=[f"{action_id} answered something that is not an answer: {raw!r:.80}"], readable=False
        )
    if not isinstance(entries, list):
        return ReadAnswer(
            rejections=[f"{action_id} answered 'resources' that is not a list: {entries!r:.80}"],
            readable=False,
        )
    read = ReadAnswer(output=output)
    if not storable(output):
        read.output = None
        read.rejections.append(f"{action_id} answered an output that is not JSON: {output!r:.80}")
    if entries and not ledgered:
        read.rejections.append(
            f"{action_id} is not a 'ledger' action; the {len(entries)} resource(s) it reported were dropped"
        )
        return read
    for entry in entries:
        row = normalise(entry, action_id, registry)
        if isinstance(row, str):
            read.rejections.append(row)
        else:
            read.resources.append(row)
    return read
