"""The lease rules (protocol §4, rule 6): a borrow is given back exactly, an apply that
arrives after its restore is refused, and a lease that stacks holds two runs' layers.
Also the helpers the fence rule borrows with."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from roadie import protocol
from roadie.conformance.params import invalid
from roadie.conformance.session import Failed, Session, Skipped, message_of


def another_value(spec: protocol.LeaseSpec, value: Any, *, avoid: tuple[Any, ...] = (), text_suffix: str = "") -> Any:
    """A value for the lease other than `value` (and `avoid`), one its `value` schema takes
    if it has one: the schema's examples and choices first, then one of the same kind,
    then, for a bounded number, one between `value` and a bound (a time of day from 0
    to 1 read as 0.25 is borrowed as 0.625, not 1.25)."""
    candidates: list[Any] = []
    schema = spec.value
    if schema:
        candidates += list(schema.get("examples") or []) + list(schema.get("enum") or [])
    if text_suffix and isinstance(value, str):
        candidates.append(f"{value}{text_suffix}")
    with contextlib.suppress(Skipped):
        candidates.append(_other_value(value))
    if schema and isinstance(value, int | float) and not isinstance(value, bool):
        for bound in ("maximum", "minimum"):
            if isinstance(schema.get(bound), int | float):
                middle = (value + schema[bound]) / 2
                candidates.append(int(middle) if schema.get("type") == "integer" else middle)
    for candidate in candidates:
        if candidate != value and candidate not in avoid and (schema is None or invalid(schema, candidate) is None):
            return candidate
    taken = f" that its value schema takes ({json.dumps(schema)[:80]})" if schema else ""
    raise Skipped(f"cannot pick a value other than {json.dumps(value)[:60]}{taken}: pass --value LEASE=JSON")


def _other_value(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 1.0
    if isinstance(value, str):
        return value + "-roadie" if not value.endswith("-roadie") else value[: -len("-roadie")] or "roadie"
    if isinstance(value, list) and value:
        return [*value, value[-1]]
    raise Skipped(f"cannot pick a second value like {json.dumps(value)[:60]}: pass --value LEASE=JSON")


def targets(
    s: Session, specs: list[protocol.LeaseSpec], skipped: list[str]
) -> Iterator[tuple[protocol.LeaseSpec, str | None, str]]:
    """Each lease with the target it is tried on and its label (`weather#yew`); a targeted
    lease with no `--target` is noted in `skipped` instead."""
    for spec in specs:
        target = s.options.targets.get(spec.name)
        if spec.targeted and target is None:
            skipped.append(f"{spec.name} (targeted: pass --target {spec.name}=TARGET)")
            continue
        yield spec, target, spec.name + (f"#{target}" if target is not None else "")


def summary(done: list[str], skipped: list[str]) -> str:
    if not done:
        raise Skipped("; ".join(skipped))
    return "; ".join(done + [f"skipped {x}" for x in skipped])


async def borrow(
    s: Session, spec: protocol.LeaseSpec, target: str | None, label: str, name: str, skipped: list[str]
) -> tuple[str, Any, Any] | None:
    """Borrow a lease target as a run does: read it under a new key named `name`, then
    apply another value (the one `--value` gives, else one `another_value` finds), noted in
    `s.borrowed` so that `cleanup` gives it back. The key, the value read and the value
    applied; None, with why in `skipped`, when no other value can be found."""
    key = s.new_key(name)
    v0 = await s.lease_read(spec.name, target, key, f"{label} read")
    try:
        v1 = s.options.values[spec.name] if spec.name in s.options.values else another_value(spec, v0)
    except Skipped as exc:
        skipped.append(f"{label}: {exc}")
        return None
    s.borrowed.setdefault((spec.name, target), (key, v0))
    await s.ok("lease.apply", s.lease_body(spec.name, target, key, v1), f"{label} apply {json.dumps(v1)}")
    return key, v0, v1


async def check_lease_restore(s: Session) -> str:
    assert s.manifest is not None
    if not s.manifest.leases:
        raise Skipped("the manifest declares no lease")
    done: list[str] = []
    skipped: list[str] = []
    for spec, target, label in targets(s, s.manifest.leases, skipped):
        taken = await borrow(s, spec, target, label, f"lease-{spec.name}", skipped)
        if taken is None:
            continue
        key, v0, v1 = taken
        now = await s.lease_read(spec.name, target, key, f"{label} read after apply")
        if now != v1:
            raise Failed(f"{label}: applied {json.dumps(v1)} but read {json.dumps(now)}")
        restore = s.lease_body(spec.name, target, s.new_key(f"restore-{spec.name}"), v0)
        await s.ok("lease.restore", restore, f"{label} restore {json.dumps(v0)}")
        back = await s.lease_read(spec.name, target, key, f"{label} read after restore")
        if back != v0:
            raise Failed(f"{label}: restored {json.dumps(v0)} but read {json.dumps(back)}")
        s.borrowed.pop((spec.name, target), None)
        done.append(f"{label} {json.dumps(v0)}→{json.dumps(v1)}→{json.dumps(v0)}")
    return summary(done, skipped)


async def check_lease_late_apply(s: Session) -> str:
    """A borrow's apply delivered again after its restore (a pulled call handed out again,
    a slow request) must be refused, and the restored value stay (protocol §4, rule 6)."""
    assert s.manifest is not None
    if not s.manifest.leases:
        raise Skipped("the manifest declares no lease")
    done: list[str] = []
    skipped: list[str] = []
    for spec, target, label in targets(s, s.manifest.leases, skipped):
        taken = await borrow(s, spec, target, label, f"late-{spec.name}", skipped)
        if taken is None:
            continue
        key, v0, v1 = taken
        restore = s.lease_body(spec.name, target, s.new_key(f"restore-{spec.name}"), v0)
        await s.ok("lease.restore", restore, f"{label} restore {json.dumps(v0)}")
        status, answer = await s.ask("lease.apply", s.lease_body(spec.name, target, key, v1))
        now = await s.lease_read(spec.name, target, s.new_key(f"check-{spec.name}"), f"{label} read after")
        if now != v0:
            raise Failed(
                f"{label}: an apply delivered after its restore wrote {json.dumps(now)} over the restored "
                f"{json.dumps(v0)} (answered {status}); keep lease keys in the key ledger"
            )
        if 200 <= status < 300 or protocol.retryable_status(status):
            raise Failed(f"{label}: an apply delivered after its restore answered {status}, not a refusal (4xx)")
        s.borrowed.pop((spec.name, target), None)
        done.append(f"{label}: refused with {status} ({message_of(answer)[:80]})")
    return summary(done, skipped)


async def check_lease_layers(s: Session) -> str:
    """A lease that stacks is held by two runs at once: each run's borrow is read and
    applied under its own key and run, and giving back the top one (a restore by its run,
    writing the other's value) must neither be refused nor undo the other run's borrow."""
    assert s.manifest is not None
    stacked = [spec for spec in s.manifest.leases if spec.stacks]
    if not stacked:
        raise Skipped("the manifest declares no lease that stacks")
    done: list[str] = []
    skipped: list[str] = []
    first, second = s.run_id, s.run_id + 1
    for spec, target, label in targets(s, stacked, skipped):
        key_a, key_b = s.new_key(f"layer-a-{spec.name}"), s.new_key(f"layer-b-{spec.name}")
        v0 = await s.lease_read(spec.name, target, key_a, f"{label} read (run {first})", run_id=first)
        try:
            v1 = s.options.values[spec.name] if spec.name in s.options.values else another_value(spec, v0)
            v2 = another_value(spec, v1, avoid=(v0,), text_suffix="-layer")
            if v2 in (v0, v1):
                raise Skipped(f"cannot pick a third value after {json.dumps(v0)[:40]} and {json.dumps(v1)[:40]}")
        except Skipped as exc:
            skipped.append(f"{label}: {exc}")
            continue
        s.borrowed.setdefault((spec.name, target), (key_a, v0))
        await s.ok(
            "lease.apply", s.lease_body(spec.name, target, key_a, v1, run_id=first), f"{label} apply (run {first})"
        )
        await s.lease_read(spec.name, target, key_b, f"{label} read (run {second})", run_id=second)
        body = s.lease_body(spec.name, target, key_b, v2, run_id=second)
        await s.ok("lease.apply", body, f"{label} apply over it (run {second})")
        if (now := await s.lease_read(spec.name, target, key_b, f"{label} read", run_id=second)) != v2:
            raise Failed(f"{label}: the second run applied {json.dumps(v2)} but read {json.dumps(now)}")
        pop = s.lease_body(spec.name, target, s.new_key(f"restore-b-{spec.name}"), v1, run_id=second)
        await s.ok("lease.restore", pop, f"{label} restore the second run's layer to {json.dumps(v1)}")
        if (now := await s.lease_read(spec.name, target, key_a, f"{label} read", run_id=first)) != v1:
            raise Failed(
                f"{label}: the second run's layer was given back to {json.dumps(v1)} but read {json.dumps(now)}"
            )
        last = s.lease_body(spec.name, target, s.new_key(f"restore-a-{spec.name}"), v0, run_id=first)
        await s.ok("lease.restore", last, f"{label} restore the first run's layer to {json.dumps(v0)}")
        if (now := await s.lease_read(spec.name, target, key_a, f"{label} read", run_id=first)) != v0:
            raise Failed(f"{label}: given back to {json.dumps(v0)} but read {json.dumps(now)}")
        s.borrowed.pop((spec.name, target), None)
        done.append(f"{label} {json.dumps(v0)}→{json.dumps(v1)}→{json.dumps(v2)}→{json.dumps(v1)}→{json.dumps(v0)}")
    return summary(done, skipped)
