"""The last rule: everything the checks made is reverted by key and every borrowed value
given back, so that checking a live world leaves nothing behind."""

from __future__ import annotations

import json

from roadie.conformance.session import Failed, Session, Skipped


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
