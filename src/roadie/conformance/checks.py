"""The rules a module server is checked against (docs/protocol.md, "Conformance").

Each rule is one coroutine over a `Session`: it raises `Failed` with what it saw, or
`Skipped` when it does not apply, and otherwise answers a line of detail. The rules only
ever talk to the module through a `Transport`, so the same rules check a push server and
a polling module. Every ledger dispatch is made under a key of this session, and the
last rule, `cleanup`, reverts every one of them, so that checking a live world leaves
nothing behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol, runtime_checkable

from pydantic import ValidationError

from roadie import protocol
from roadie.conformance.params import check_schema, example_params, invalid
from roadie.conformance.report import Outcome, Report, RuleResult
from roadie.conformance.session import (
    ATTEMPTS,
    ConformanceOptions,
    Failed,
    Made,
    Session,
    Skipped,
    first_error,
    message_of,
    refs_of,
)
from roadie.conformance.transport import Kind, RawTransport, Transport, path_of

# -- the rules ------------------------------------------------------------------------


async def check_manifest(s: Session) -> str:
    status, answer = await s.ask("manifest", None)
    if status != 200:
        raise Failed(f"GET {protocol.MANIFEST} answered {status}: {message_of(answer)}")
    try:
        manifest = protocol.Manifest.model_validate(answer)
    except ValidationError as exc:
        raise Failed(f"not a {protocol.VERSION} manifest: {first_error(exc)}") from exc
    problems = []
    for spec in manifest.actions:
        why = check_schema(spec.params)
        if why is not None:
            problems.append(f"{spec.name}: params is not a valid JSON Schema: {why}")
    names = {a.name for a in manifest.actions}
    leases = {lease.name for lease in manifest.leases}
    problems += [
        f"--params names {n!r}, which the manifest does not declare" for n in s.options.params if n not in names
    ]
    problems += [
        f"--target names {n!r}, which the manifest does not declare" for n in s.options.targets if n not in leases
    ]
    problems += [
        f"--value names {n!r}, which the manifest does not declare" for n in s.options.values if n not in leases
    ]
    if problems:
        raise Failed("; ".join(problems))
    s.manifest = manifest
    _choose_action(s, manifest)
    ledger = [a.name for a in manifest.actions if a.reversible == "ledger"]
    parts = [f"module {manifest.module}: {len(manifest.actions)} action(s), {len(manifest.leases)} lease(s)"]
    if s.action is not None:
        parts.append(f"testing with {s.action.name} {json.dumps(s.params)}")
    elif not ledger:
        parts.append("no ledger action: the ledger rules are skipped")
    else:
        raise Failed(s.no_action)
    if not manifest.inspect:
        parts.append("no inspect: what reverts did cannot be verified")
    if not manifest.tagged:
        parts.append("no tagged: the orphan sweep cannot reach it")
    return "; ".join(parts)


def _choose_action(s: Session, manifest: protocol.Manifest) -> None:
    """The first ledger action with valid parameters, preferring those given --params."""
    ledger = [a for a in manifest.actions if a.reversible == "ledger"]
    ledger.sort(key=lambda a: a.name not in s.options.params)
    reasons = []
    for spec in ledger:
        given = s.options.params.get(spec.name)
        params = dict(given) if given is not None else example_params(spec.params)
        why = invalid(spec.params, params)
        if why is None:
            s.action, s.params = spec, params
            return
        reasons.append(f"{spec.name} {json.dumps(params)}: {why}")
    if ledger:
        s.no_action = "no ledger action has valid params to test with (" + "; ".join(reasons) + "): pass --params"
    else:
        s.no_action = "the manifest declares no ledger action"


async def check_same_key(s: Session) -> str:
    key = s.new_key("same")
    first = await s.dispatch(key, attempt=1, what="first dispatch")
    second = await s.dispatch(key, attempt=2, what="second dispatch under the same key")
    if first.get("resources") != second.get("resources"):
        raise Failed(
            f"the same key dispatched twice acted twice: made {refs_of(first['resources'])}, "
            f"then {refs_of(second.get('resources', []))}"
        )
    if first.get("output") != second.get("output"):
        raise Failed("the same key dispatched twice answered a different output: the stored answer was not returned")
    n = s.options.concurrency
    together = s.new_key("concurrent")
    answers = await asyncio.gather(
        *(s.dispatch(together, attempt=i + 1, what=f"concurrent dispatch {i + 1}/{n}") for i in range(n))
    )
    distinct = {json.dumps(a.get("resources"), sort_keys=True) for a in answers}
    if len(distinct) > 1:
        seen = sorted({ref for a in answers for ref in refs_of(a.get("resources", []))})
        raise Failed(f"{n} concurrent dispatches under one key answered {len(distinct)} different sets: {seen[:12]}")
    if len({json.dumps(a.get("output"), sort_keys=True, default=str) for a in answers}) > 1:
        raise Failed(f"{n} concurrent dispatches under one key answered different outputs")
    detail = f"2 in a row and {n} at once under one key: the same {len(first.get('resources', []))} resource(s)"
    if s.transport.mode == "pull":
        # The queue keeps one call per key and body: the duplicates reach the module as
        # one call (and again only as a redelivery), so this checks the queue as much.
        detail += " (pull: duplicates share one queued call)"
    return detail


async def check_inspect(s: Session) -> str:
    assert s.manifest is not None
    s.need_action()
    if not s.manifest.inspect:
        raise Skipped("the manifest does not declare inspect")
    key = s.new_key("inspect")
    resources = await s.made_something(key)
    found = await s.inspect(key, resources, "inspect of fresh resources")
    wrong = [f"{i.kind}:{i.ref} exists={i.exists} ours={i.ours}" for i in found if not (i.exists and i.ours)]
    if wrong:
        raise Failed(f"fresh resources should be exists=true ours=true: {', '.join(wrong)}")
    return f"{len(found)} fresh resource(s): exists and ours"


async def check_tagged(s: Session) -> str:
    assert s.manifest is not None
    s.need_action()
    if not s.manifest.tagged:
        raise Skipped("the manifest does not declare tagged (the orphan sweep cannot reach this module)")
    key = s.new_key("listed")
    resources = await s.made_something(key)
    listed = await s.tagged("tagged, after a dispatch")
    mine = {(o.kind, o.ref) for o in listed if o.key == key}
    missing = [f"{r.get('kind')}:{r.get('ref')}" for r in resources if (r.get("kind"), r.get("ref")) not in mine]
    if missing:
        raise Failed(f"tagged does not list what key {key} just made: {', '.join(missing)}")
    answer = await s.revert(key, resources, "revert of what tagged listed")
    if answer.failures:
        raise Failed(f"revert reported failures: {[f.message for f in answer.failures]}")
    s.gone.append((key, resources))
    after = await s.tagged("tagged, after the revert")
    left = [f"{o.kind}:{o.ref}" for o in after if o.key == key]
    if left:
        raise Failed(f"tagged still lists what was reverted: {', '.join(left)}")
    return (
        f"{len(resources)} resource(s) listed under their key, and no more once reverted ({len(listed)} tagged in all)"
    )


async def check_revert_by_key(s: Session) -> str:
    assert s.manifest is not None
    key = s.new_key("bykey")
    resources = await s.made_something(key)
    answer = await s.revert(key, [], "revert by key alone (resources: [])")
    if answer.failures:
        raise Failed(f"revert by key alone reported failures: {[f.message for f in answer.failures]}")
    s.gone.append((key, resources))
    if not s.manifest.inspect:
        return "answered without failures (not verified: no inspect)"
    found = await s.inspect(key, resources, "inspect after revert by key")
    left = [f"{i.kind}:{i.ref}" for i in found if i.exists and i.ours]
    if left:
        raise Failed(f"after revert with resources [], still there and tagged with the key: {', '.join(left)}")
    return f"{len(resources)} resource(s) made, reverted by the key alone, gone"


async def check_foreign_tag(s: Session) -> str:
    assert s.manifest is not None
    s.need_action()
    if not s.manifest.inspect:
        raise Skipped("needs inspect to see that the objects are still there")
    mine = s.new_key("tagged")
    resources = await s.made_something(mine)
    other = s.new_key("foreign")
    answer = await s.revert(other, resources, "revert of another key's resources")
    if answer.failures:
        raise Failed(
            "reverting objects tagged with another key must succeed and leave them alone, "
            f"but it reported failures: {[f.message for f in answer.failures]}"
        )
    found = await s.inspect(mine, resources, "inspect under the key that made them")
    removed = [f"{i.kind}:{i.ref}" for i in found if not (i.exists and i.ours)]
    if removed:
        raise Failed(f"a revert under another key removed (or re-tagged) objects it did not make: {', '.join(removed)}")
    theirs = await s.inspect(other, resources, "inspect under another key")
    claimed = [f"{i.kind}:{i.ref}" for i in theirs if i.ours]
    if claimed:
        raise Failed(f"inspect under a key that made nothing says ours=true for {', '.join(claimed)}")
    return f"{len(resources)} object(s) tagged with another key: left alone, and not ours to that key"


async def check_revert_missing(s: Session) -> str:
    s.need_action()
    checks = []
    never = s.new_key("never")
    answer = await s.revert(never, [], "revert by a key that made nothing")
    if answer.failures:
        raise Failed(f"revert by a key that made nothing reported failures: {[f.message for f in answer.failures]}")
    checks.append("a key that made nothing")
    for kind in sorted(s.kinds)[:1]:
        ghost = [{"kind": kind, "ref": f"roadie-conformance-never-made-{s.tag}"}]
        answer = await s.revert(never, ghost, "revert of a ref that was never made")
        if answer.failures:
            raise Failed(f"revert of a {kind} that was never made reported: {[f.message for f in answer.failures]}")
        checks.append(f"a {kind} that was never made")
    for key, resources in s.gone[:1]:
        answer = await s.revert(key, resources, "revert again of what was already reverted")
        if answer.failures:
            raise Failed(f"revert of what was already reverted reported: {[f.message for f in answer.failures]}")
        checks.append("what was already reverted")
    return "success for " + ", ".join(checks)


async def check_signature(s: Session) -> str:
    raw = s.transport
    if isinstance(raw, ForgingTransport):
        return await _check_forged_polls(s, raw)
    if not isinstance(raw, RawTransport):
        return "not checked: this transport sends nothing unsigned"
    if s.action is not None:
        key = s.new_key("signature")
        s.made.setdefault(key, Made(s.action.name))
        kind: Kind = "dispatch"
        body = s.dispatch_body(key)
    else:
        key = protocol.NO_KEY
        kind = "inspect"
        body = {"action": "none", "run_id": s.run_id, "idempotency_key": s.new_key("signature"), "resources": []}
    path = path_of(kind)
    content = json.dumps(body).encode()
    tampered = json.dumps({**body, "run_id": s.run_id + 1}).encode()
    signed = raw.signed("POST", path, content, key)
    # The one genuine request: carried out, and its answer signed for it.
    status, answer = await raw.send_raw("POST", path, content, signed)
    if status == 401:
        raise Failed(f"a correctly signed request was refused: {answer}")
    if s.action is not None and status == 200 and isinstance(answer, dict):
        s.made[key].resources.extend(r for r in answer.get("resources") or [] if isinstance(r, dict))
    try:
        protocol.verify_answer(raw.secret, signed[protocol.H_ID], path, raw.answer_headers, raw.answer_bytes)
    except protocol.SignatureRefused as exc:
        raise Failed(f"the answer to a signed request is not signed for it: {exc.message}") from None
    oversized = b'{"pad":"' + b"x" * protocol.MAX_BODY_BYTES + b'"}'
    cases: list[tuple[str, str, str, bytes, dict[str, str], tuple[int, ...]]] = [  # with the refusals expected
        ("unsigned manifest", "GET", protocol.MANIFEST, b"", {protocol.H_KEY: protocol.NO_KEY}, (401,)),
        ("unsigned", "POST", path, content, {protocol.H_KEY: key, "Content-Type": "application/json"}, (401,)),
        (
            "wrong signature",
            "POST",
            path,
            content,
            protocol.sign(s.tag + "-not-the-secret", "POST", path, content, key=key),
            (401,),
        ),
        (
            "stale timestamp (1 h old)",
            "POST",
            path,
            content,
            raw.signed("POST", path, content, key, now=time.time() - 3600),
            (401,),
        ),
        ("tampered body", "POST", path, tampered, signed, (401,)),
        ("replayed (the request above, sent again)", "POST", path, content, signed, (401,)),
        (
            "re-targeted (signed for another path)",
            "POST",
            path,
            content,
            raw.signed("POST", protocol.REVERT if path != protocol.REVERT else protocol.DISPATCH, content, key),
            (401,),
        ),
        ("oversized (over 8 MiB)", "POST", path, oversized, raw.signed("POST", path, oversized, key), (413,)),
    ]
    wrong = []
    for name, method, where, data, headers, refusals in cases:
        status, answer = await raw.send_raw(method, where, data, headers)
        if status not in refusals:
            wrong.append(f"{name} → {status}")
        elif not (isinstance(answer, dict) and isinstance(answer.get("error"), dict) and "message" in answer["error"]):
            wrong.append(f"{name} → {status} without an {{'error': {{'message'}}}} body")
    if wrong:
        raise Failed("not refused: " + "; ".join(wrong))
    return f"the answer signed for its request; {len(cases)} bad requests refused (401, 413)"


FORGED_CALL_IDS = 2_000_000_000  # ids no queued call has: the forged calls' own


@runtime_checkable
class ForgingTransport(Protocol):
    """A transport that can answer the module's polls with forged work (pull mode)."""

    async def forged_polls(self, calls: list[tuple[str, protocol.PulledCall]]) -> list[int]: ...


async def _check_forged_polls(s: Session, queue: ForgingTransport) -> str:
    """Pull: the gateway refused any of the module's requests not signed with its secret
    (or replayed); and the module must carry out nothing from a poll answer that is
    unsigned, signed with another secret, or signed for another of its requests (anyone
    between it and the engine could have written or recorded it)."""
    forged: list[tuple[str, protocol.PulledCall]] = []
    for n, how in enumerate(("unsigned", "wrongly signed", "replayed")):
        key = s.new_key("forged")
        if s.action is not None:
            kind: protocol.CallKind = "dispatch"
            body = s.dispatch_body(key)
            s.made.setdefault(key, Made(s.action.name))  # reverted at the end, should it have acted
        else:
            kind = "inspect"
            body = {"action": "none", "run_id": s.run_id, "idempotency_key": key, "resources": []}
        call = protocol.PulledCall(
            id=FORGED_CALL_IDS + n, kind=kind, path=protocol.CALL_PATHS[kind], idempotency_key=key, body=body,
            delivery=1, token=f"forged-{s.tag}-{n}",
        )  # fmt: skip
        forged.append((how, call))
    answered = set(await queue.forged_polls(forged))
    acted = {how for how, call in forged if call.id in answered}
    if s.action is not None and s.manifest is not None and s.manifest.tagged:
        made = {o.key for o in await s.tagged("tagged, after the forged polls")}  # an answer may be lost
        acted |= {how for how, call in forged if call.idempotency_key in made}
    if acted:
        raise Failed(
            f"carried out a call from a poll answer that was {' and '.join(sorted(acted))}: "
            "check the answer's signature (protocol.md §5) before acting on it"
        )
    return (
        "pull: the module's requests were signed with its secret; it carried out nothing from an unsigned, "
        "a wrongly signed or a replayed poll answer"
    )


async def check_malformed(s: Session) -> str:
    key = s.new_key("malformed")
    action = s.action.name if s.action is not None else "none"
    cases: list[tuple[str, Kind, Any]] = [
        ("missing fields", "dispatch", {"idempotency_key": key}),
        ("wrong shape", "dispatch", {"action": action, "run_id": "one", "step_id": [], "idempotency_key": key}),
        (
            "unknown action",
            "dispatch",
            {"action": "no_such_action_roadie", "run_id": s.run_id, "step_id": 0, "idempotency_key": key, "attempt": 1},
        ),
        (
            "unknown lease",
            "lease.read",
            {"lease": "no_such_lease_roadie", "target": None, "run_id": s.run_id, "idempotency_key": key},
        ),
    ]
    wrong = []
    seen = []
    raw = s.transport
    if isinstance(raw, RawTransport):
        content = b'{"action": "spawn", not json'
        for _ in range(ATTEMPTS):  # a busy answer (429, 409, 503) says nothing of the body: ask again
            status, answer = await raw.send_raw(
                "POST", protocol.DISPATCH, content, raw.signed("POST", protocol.DISPATCH, content, key)
            )
            if not protocol.retryable_status(status):
                break
        seen.append(f"invalid JSON {status}")
        if not 400 <= status < 500:
            wrong.append(f"invalid JSON → {status}")
    for name, kind, body in cases:
        status, answer = await s.ask(kind, body)
        seen.append(f"{name} {status}")
        if not 400 <= status < 500:
            wrong.append(f"{name} → {status} {message_of(answer)}")
    if wrong:
        raise Failed("malformed requests must get a 4xx: " + "; ".join(wrong))
    return ", ".join(seen)


def _another(spec: protocol.LeaseSpec, value: Any, *, avoid: tuple[Any, ...] = (), text_suffix: str = "") -> Any:
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


def _targets(
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


def _done(done: list[str], skipped: list[str]) -> str:
    if not done:
        raise Skipped("; ".join(skipped))
    return "; ".join(done + [f"skipped {x}" for x in skipped])


async def _borrow(
    s: Session, spec: protocol.LeaseSpec, target: str | None, label: str, name: str, skipped: list[str]
) -> tuple[str, Any, Any] | None:
    """Borrow a lease target as a run does: read it under a new key named `name`, then
    apply another value (the one `--value` gives, else one `_another` finds), noted in
    `s.borrowed` so that `cleanup` gives it back. The key, the value read and the value
    applied; None, with why in `skipped`, when no other value can be found."""
    key = s.new_key(name)
    v0 = await s.lease_read(spec.name, target, key, f"{label} read")
    try:
        v1 = s.options.values[spec.name] if spec.name in s.options.values else _another(spec, v0)
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
    for spec, target, label in _targets(s, s.manifest.leases, skipped):
        borrow = await _borrow(s, spec, target, label, f"lease-{spec.name}", skipped)
        if borrow is None:
            continue
        key, v0, v1 = borrow
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
    return _done(done, skipped)


async def check_lease_late_apply(s: Session) -> str:
    """A borrow's apply delivered again after its restore (a pulled call handed out again,
    a slow request) must be refused, and the restored value stay (protocol §4, rule 6)."""
    assert s.manifest is not None
    if not s.manifest.leases:
        raise Skipped("the manifest declares no lease")
    done: list[str] = []
    skipped: list[str] = []
    for spec, target, label in _targets(s, s.manifest.leases, skipped):
        borrow = await _borrow(s, spec, target, label, f"late-{spec.name}", skipped)
        if borrow is None:
            continue
        key, v0, v1 = borrow
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
    return _done(done, skipped)


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
    for spec, target, label in _targets(s, stacked, skipped):
        key_a, key_b = s.new_key(f"layer-a-{spec.name}"), s.new_key(f"layer-b-{spec.name}")
        v0 = await s.lease_read(spec.name, target, key_a, f"{label} read (run {first})", run_id=first)
        try:
            v1 = s.options.values[spec.name] if spec.name in s.options.values else _another(spec, v0)
            v2 = _another(spec, v1, avoid=(v0,), text_suffix="-layer")
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
    return _done(done, skipped)


def _refused_as_superseded(what: str, status: int, answer: Any, mark: int) -> None:
    """Raise Failed unless the answer is the 412 that rule 7 asks for."""
    if protocol.is_superseded(status, answer):
        said = answer["error"].get("fence")
        if said is not None and said != mark:
            raise Failed(f"{what}: refused, but says the mark is {said}, where fence {mark} was accepted")
        return
    if 200 <= status < 300:
        why = "answered as if the fence did not matter"
    else:
        why = f"not a 412 with code superseded ({message_of(answer)[:80]})"
    raise Failed(f"{what}: answered {status}, {why}; keep the highest fence per key and lease target (§4, rule 7)")


async def check_stale_fence(s: Session) -> str:
    """Rule 7: a call whose fence is lower than one the module accepted for the same key or
    lease target is refused with 412 `superseded` and does nothing (no stored answer
    replayed, nothing made or removed, the lease value left); an equal fence, a retry of
    the same claim, is accepted."""
    assert s.manifest is not None
    done: list[str] = []
    skipped: list[str] = []
    if s.action is not None:
        key = s.new_key("fence")
        first = await s.dispatch(key, what="dispatch under a fence")
        fence = s.key_fence(key)
        status, answer = await s.ask("dispatch", s.dispatch_body(key, attempt=2, fence=fence - 1))
        _refused_as_superseded(f"a dispatch under fence {fence - 1}, after one under {fence}", status, answer, fence)
        again = await s.dispatch(key, attempt=3, what=f"a retry under the same fence {fence}")
        if again.get("resources") != first.get("resources"):
            raise Failed(f"a retry under an equal fence did not get the stored answer: {refs_of(again['resources'])}")
        if s.manifest.tagged:
            listed = [o for o in await s.tagged("tagged, after the stale dispatch") if o.key == key]
            if len(listed) > len(first.get("resources") or []):
                raise Failed(f"the stale dispatch made something: {len(listed)} object(s) tagged with its key")
        done.append(f"dispatch under {fence - 1} after {fence}: 412; under {fence} again: the stored answer")

        other = s.new_key("fence-revert")
        made = (await s.dispatch(other, what="dispatch of a key to revert")).get("resources") or []
        fence = s.key_fence(other)
        status, answer = await s.ask("revert", s.revert_body(other, made, fence=fence - 1))
        _refused_as_superseded(
            f"a revert under fence {fence - 1}, after a dispatch under {fence}", status, answer, fence
        )
        if made and s.manifest.inspect:
            found = await s.inspect(other, made, "inspect after the stale revert")
            gone = [f"{i.kind}:{i.ref}" for i in found if not (i.exists and i.ours)]
            if gone:
                raise Failed(f"the stale revert was refused, yet removed {', '.join(gone)}")
        done.append(f"revert under {fence - 1} after a dispatch under {fence}: 412, nothing removed")
    else:
        skipped.append(f"dispatch and revert ({s.no_action or 'no ledger action'})")
    for spec, target, label in _targets(s, s.manifest.leases, skipped):
        if any(d.startswith("lease") for d in done):
            break  # one lease target shows it
        borrow = await _borrow(s, spec, target, label, f"fence-{spec.name}", skipped)
        if borrow is None:
            continue
        key, v0, v1 = borrow
        fence = s.lease_fence(spec.name, target)
        late = s.new_key(f"fence-late-{spec.name}")
        await s.lease_read(spec.name, target, late, f"{label} read by an older owner")
        stale = {**s.lease_body(spec.name, target, late, v0), "fence": fence - 1}
        status, answer = await s.ask("lease.apply", stale)
        now = await s.lease_read(spec.name, target, s.new_key(f"fence-check-{spec.name}"), f"{label} read after")
        if now != v1:
            raise Failed(
                f"{label}: an apply under fence {fence - 1}, after one under {fence}, wrote {json.dumps(now)} "
                f"over {json.dumps(v1)} (answered {status})"
            )
        _refused_as_superseded(
            f"{label}: an apply under fence {fence - 1}, after one under {fence}", status, answer, fence
        )
        restore = s.lease_body(spec.name, target, s.new_key(f"restore-{spec.name}"), v0)
        await s.ok("lease.restore", restore, f"{label} restore under the same fence {fence}")
        if (back := await s.lease_read(spec.name, target, key, f"{label} read after restore")) != v0:
            raise Failed(f"{label}: restored {json.dumps(v0)} under an equal fence but read {json.dumps(back)}")
        s.borrowed.pop((spec.name, target), None)
        done.append(f"lease {label}: apply under {fence - 1} after {fence}: 412, value kept; restore under {fence}")
    return _done(done, skipped)


async def check_cleanup(s: Session) -> str:
    """Revert every key this session dispatched under, and give back every borrowed value."""
    problems = []
    reverted = 0
    for key, made in s.made.items():
        try:
            if made.resources:
                answer = await s.revert(key, made.resources, f"cleanup revert of {key}")
                problems += [f"{key} {f.kind}:{f.ref}: {f.message}" for f in answer.failures]
            answer = await s.revert(key, [], f"cleanup revert of {key} by key")
            problems += [f"{key} {f.kind}:{f.ref}: {f.message}" for f in answer.failures]
            if made.resources and s.manifest is not None and s.manifest.inspect:
                found = await s.inspect(key, made.resources, f"cleanup inspect of {key}")
                problems += [f"{key} {i.kind}:{i.ref} is still there" for i in found if i.exists and i.ours]
            reverted += len(made.resources)
        except (Failed, Skipped) as exc:
            problems.append(str(exc))
    for (lease, target), (key, value) in list(s.borrowed.items()):
        label = lease + (f"#{target}" if target is not None else "")
        try:
            restore = s.lease_body(lease, target, s.new_key(f"restore-{lease}"), value)
            await s.ok("lease.restore", restore, f"cleanup restore of {label}")
            if await s.lease_read(lease, target, key, f"cleanup read of {label}") != value:
                # Its restore is broken (the lease_restore rule says how): put the saved
                # value back by a write, so that the world is left as it was found. A new
                # borrow (read, then apply): the old key's borrow was given back.
                fix = s.new_key(f"fix-{lease}")
                await s.lease_read(lease, target, fix, f"cleanup read of {label} before its fix")
                await s.ok("lease.apply", s.lease_body(lease, target, fix, value), f"cleanup apply of {label}")
                problems.append(f"{label}: restore did not give back {json.dumps(value)}; written back by apply")
            s.borrowed.pop((lease, target))
        except Failed as exc:
            problems.append(str(exc))
    if problems:
        raise Failed("left behind: " + "; ".join(problems[:10]))
    if not s.made and not s.borrowed:
        return "nothing to clean up"
    return f"{len(s.made)} key(s) reverted ({reverted} resource(s)); nothing left behind"


Rule = Callable[[Session], Awaitable[str]]

RULES: list[tuple[str, str, Rule]] = [
    ("manifest", "manifest is valid", check_manifest),
    ("same_key", "same key: same answer, one effect", check_same_key),
    ("inspect", "inspect answers each resource", check_inspect),
    ("tagged", "tagged lists what a key made, until reverted", check_tagged),
    ("revert_by_key", "revert by key alone", check_revert_by_key),
    ("foreign_tag", "another key's object is left alone", check_foreign_tag),
    ("revert_missing", "revert of something missing succeeds", check_revert_missing),
    ("signature", "unsigned, wrong, stale, tampered: 401", check_signature),
    ("malformed", "malformed requests: 4xx, not 5xx", check_malformed),
    ("lease_restore", "lease restore gives back the saved value", check_lease_restore),
    ("lease_late_apply", "an apply after its restore is refused", check_lease_late_apply),
    ("lease_layers", "a lease that stacks holds two runs' layers", check_lease_layers),
    ("stale_fence", "a stale fence is refused (412), an equal one accepted", check_stale_fence),
    ("cleanup", "everything the checks made is reverted", check_cleanup),
]
RULE_NAMES = [name for name, _, _ in RULES]


async def run_checks(transport: Transport, options: ConformanceOptions, *, url: str) -> Report:
    """Check the module behind `transport` against every rule, in order."""
    session = Session(transport, options)
    report = Report(url=url, mode=transport.mode)
    wanted = set(options.rules) if options.rules else None
    for name, title, rule in RULES:
        if wanted is not None and name not in wanted and name not in ("manifest", "cleanup"):
            continue
        if name not in ("manifest", "cleanup") and session.manifest is None:
            report.results.append(RuleResult(name, title, Outcome.SKIP, "no valid manifest"))
            continue
        try:
            detail = await asyncio.wait_for(rule(session), options.rule_timeout)
        except Failed as exc:
            report.results.append(RuleResult(name, title, Outcome.FAIL, str(exc)))
        except Skipped as exc:
            report.results.append(RuleResult(name, title, Outcome.SKIP, str(exc)))
        except TimeoutError:
            report.results.append(RuleResult(name, title, Outcome.FAIL, f"not done within {options.rule_timeout:.0f}s"))
        else:
            report.results.append(RuleResult(name, title, Outcome.PASS, detail))
        if name == "manifest" and session.manifest is not None:
            report.module = session.manifest.module
    return report
