"""The fence rule (protocol §4, rule 7): a call under a fence lower than one accepted for
the same key or lease target is refused with 412 `superseded` and does nothing."""

from __future__ import annotations

import json
from typing import Any

from roadie import protocol
from roadie.conformance.rules.leases import borrow, summary, targets
from roadie.conformance.session import Failed, Session, message_of, refs_of


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
    for spec, target, label in targets(s, s.manifest.leases, skipped):
        if any(d.startswith("lease") for d in done):
            break  # one lease target shows it
        taken = await borrow(s, spec, target, label, f"fence-{spec.name}", skipped)
        if taken is None:
            continue
        key, v0, v1 = taken
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
    return summary(done, skipped)
