"""The rules a module server is checked against (docs/protocol.md, "Conformance"), in the
order they run.

Each rule is one coroutine over a `Session`: it raises `Failed` with what it saw, or
`Skipped` when it does not apply, and otherwise answers a line of detail. The rules only
ever talk to the module through a `Transport`, so the same rules check a push server and
a polling module. Every ledger dispatch is made under a key of this session, and the
last rule, `cleanup`, reverts every one of them, so that checking a live world leaves
nothing behind.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from roadie.conformance.rules.bad_requests import check_malformed, check_signature
from roadie.conformance.rules.cleanup import check_cleanup
from roadie.conformance.rules.fences import check_stale_fence
from roadie.conformance.rules.leases import check_lease_late_apply, check_lease_layers, check_lease_restore
from roadie.conformance.rules.ledger import (
    check_foreign_tag,
    check_inspect,
    check_revert_by_key,
    check_revert_missing,
    check_same_key,
    check_tagged,
)
from roadie.conformance.rules.manifest import check_manifest
from roadie.conformance.session import Session

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
