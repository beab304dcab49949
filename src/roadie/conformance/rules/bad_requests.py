"""The rules of bad requests: whatever is not signed for the module, or is signed but
stale, tampered, replayed, re-targeted or oversized, is refused (401, 413) with an error
body, and the answer to a good one is signed for it; in pull mode the module carries out
nothing from a poll answer it cannot trust. A malformed request gets a 4xx, never a 5xx."""

from __future__ import annotations

import json
import time
from typing import Any, Protocol, runtime_checkable

from roadie import protocol
from roadie.conformance.session import ATTEMPTS, Failed, Made, Session, message_of
from roadie.conformance.transport import Kind, RawTransport, path_of


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
