"""The ledger rules (protocol §4, rules 1 to 5): one effect per key, however often and
however concurrently it is sent; inspect and tagged tell the truth; a revert by key alone
removes what the key made, leaves what another key made, and succeeds for what is gone."""

from __future__ import annotations

import asyncio
import json

from roadie.conformance.session import Failed, Session, Skipped, refs_of


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
