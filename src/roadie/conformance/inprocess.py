"""Conformance of a module Roadie runs in its own process (a console world, or a Python
module) against the live world it reaches: every ledger action done, read back, done
again under the same key (nothing more is made), reverted by its key alone, read back
again; every lease read, written, read back, restored and read back.

Everything is made under keys of its own and taken down before the check ends. An action
that cannot be taken back (`none`, `self`: a broadcast to every player) is run only when
its params are given.

Fences (docs/protocol.md §4, rule 7): a key's dispatches go under a fence minted for it,
its reverts under newer ones, as the engine's claims would; and one more check, `fences`,
sends a key's dispatch and revert under a fence lower than one the module accepted, which
it must refuse with `Superseded` and nothing done. Lease writes go under fence 0 (no
claim): the kit cannot learn the mark the engine's borrows left on a live target, and a
fence of its own could be refused by it, or raise it above the engine's next.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from roadie.clock import Clock, SystemClock
from roadie.conformance.report import Outcome, Report, RuleResult
from roadie.errors import Superseded
from roadie.registry import (
    Answer,
    Call,
    InspectCall,
    Inspected,
    LeaseCall,
    Registry,
    Resource,
    RevertCall,
    TaggedCall,
    TaggedPage,
)
from roadie.registry.examples import example_params
from roadie.registry.module import Action, Lease, Module, maybe_await
from roadie.states import Reversible


async def check_module(
    registry: Registry,
    name: str,
    *,
    params: dict[str, Any] | None = None,
    values: dict[str, Any] | None = None,
    targets: dict[str, str] | None = None,
    clock: Clock | None = None,
) -> Report:
    module = registry.module(name)
    checker = _Checker(registry, name, params or {}, values or {}, targets or {}, clock or SystemClock())
    report = Report(url=f"roadie.toml: modules.{name}", mode="in-process", module=name)
    for action in module.actions.values():
        report.results.append(await checker.guarded(f"action {action.id}", action.description, checker.action, action))
    for lease in module.leases.values():
        report.results.append(await checker.guarded(f"lease {lease.id}", lease.description, checker.lease, lease))
    report.results.append(
        await checker.guarded("fences", "a stale fence is refused, an equal one accepted", checker.fences, module)
    )
    return report


class Failed(Exception):
    pass


class _Checker:
    def __init__(
        self,
        registry: Registry,
        name: str,
        params: dict[str, Any],
        values: dict[str, Any],
        targets: dict[str, str],
        clock: Clock,
    ) -> None:
        self.registry = registry
        self.module = registry.module(name)
        self.state = registry.state(name)
        self.params = params
        self.values = values
        self.targets = targets
        self.clock = clock
        self.nonce = secrets.token_hex(6)
        self.seq = 0
        self.fence = 0  # the last fence minted: every key is new, so any count will do

    async def guarded(
        self, rule: str, title: str, check: Callable[[Any], Awaitable[tuple[Outcome, str]]], what: Any
    ) -> RuleResult:
        try:
            outcome, detail = await check(what)
        except Failed as failed:
            outcome, detail = Outcome.FAIL, str(failed)
        except Exception as exc:  # the module's error is the finding
            outcome, detail = Outcome.FAIL, f"{type(exc).__name__}: {exc}"
        return RuleResult(rule, title, outcome, detail)

    def _key(self) -> str:
        self.seq += 1
        return f"{self.nonce}-0-0-{self.seq}"

    def _params_for(self, action: Action) -> dict[str, Any] | None:
        given = self.params.get(action.id, self.params.get(action.name))
        if given is not None:
            return dict(given)
        schema = getattr(action.params, "json_schema", None)
        if not isinstance(schema, dict):
            schema = action.params.model_json_schema()
        return example_params(schema)

    def _mint(self) -> int:
        self.fence += 1
        return self.fence

    async def _dispatch(self, action: Action, params: dict[str, Any], key: str, attempt: int, fence: int) -> Answer:
        call = Call(0, 0, key, attempt, action.params.model_validate(params), self.state, self.clock, fence=fence)
        answer = await action.call(call)
        return answer if isinstance(answer, Answer) else Answer(**dict(answer or {}))

    async def _inspect(self, action: Action, key: str, resources: list[Resource]) -> list[Inspected]:
        assert self.module.inspect_fn is not None
        call = InspectCall(0, key, resources, self.state, self.clock, action=action.name)
        found = list(await maybe_await(self.module.inspect_fn(call)) or [])
        return [f if isinstance(f, Inspected) else Inspected(r.kind, r.ref, bool(f["exists"]), bool(f["ours"]))
                for f, r in zip(found, resources, strict=True)]  # fmt: skip

    async def _revert(self, action: Action, key: str, resources: list[Resource], fence: int) -> list[Any]:
        assert action.revert_fn is not None
        call = RevertCall(0, key, resources, self.state, self.clock, fence=fence)
        return list(await maybe_await(action.revert_fn(call)) or [])

    async def _tagged(self) -> list[Any]:
        if self.module.tagged_fn is None:
            return []
        found: list[Any] = []
        after: str | None = None
        while True:
            page = await maybe_await(self.module.tagged_fn(TaggedCall(after, 100, self.state, self.clock)))
            page = page if isinstance(page, TaggedPage) else TaggedPage(list(page or []))
            found.extend(page.objects)
            if page.next is None or not page.objects:
                return found
            after = page.next

    async def action(self, action: Action) -> tuple[Outcome, str]:
        if action.reversible is not Reversible.LEDGER:
            given = self.params.get(action.id, self.params.get(action.name))
            if given is None:
                return Outcome.SKIP, f"a '{action.reversible}' action cannot be taken back: give --params to run it"
            await self._dispatch(action, dict(given), self._key(), 1, self._mint())
            return Outcome.PASS, "done once"
        params = self._params_for(action)
        assert params is not None
        key = self._key()
        fence = self._mint()
        made: list[Resource] = []
        try:
            answer = await self._dispatch(action, params, key, 1, fence)
            made = [Resource(str(r["kind"]), str(r["ref"])) for r in answer.resources]
            if not made:
                raise Failed(f"with {params} it reported nothing made")
            seen = await self._inspect(action, key, made)
            if not all(i.exists and i.ours for i in seen):
                raise Failed(f"what it made does not read back as there and its own: {seen}")
            again = await self._dispatch(action, params, key, 2, fence)  # a retry: the same claim
            if sorted(str(r["ref"]) for r in again.resources) != sorted(r.ref for r in made):
                raise Failed("done again under the same key, it reported something else: not idempotent")
            tagged = [t for t in await self._tagged() if t.key == key]
            if self.module.tagged_fn is not None and len(tagged) != len(made):
                raise Failed(f"the world holds {len(tagged)} objects tagged with the key, {len(made)} were made")
        finally:
            failures = await self._revert(action, key, [], self._mint())  # by the key alone, as after a lost answer
        if failures:
            raise Failed(f"reverting by its key alone failed: {failures}")
        if made and any(i.exists for i in await self._inspect(action, key, made)):
            raise Failed("still in the world after it was reverted")
        if await self._revert(action, key, made, self._mint()):
            raise Failed("reverting what is already gone must succeed")
        return Outcome.PASS, f"made {len(made)}, read back, done again (nothing more), reverted by key, gone"

    async def fences(self, module: Module) -> tuple[Outcome, str]:
        """A ledger action's key, dispatched under fence N: a dispatch and a revert under N-1
        raise Superseded and do nothing, a dispatch under N gets the same answer; then a
        revert under N+1 takes it down."""
        ledger = [a for a in module.actions.values() if a.reversible is Reversible.LEDGER]
        if not ledger:
            return Outcome.SKIP, "no ledger action to dispatch under a fence"
        action = ledger[0]
        params = self._params_for(action)
        assert params is not None
        key = self._key()
        fence = self._mint() + 1  # N-1 must be a fence too (1 at least)
        self.fence = fence
        made: list[Resource] = []
        try:
            answer = await self._dispatch(action, params, key, 1, fence)
            made = [Resource(str(r["kind"]), str(r["ref"])) for r in answer.resources]
            try:
                await self._dispatch(action, params, key, 2, fence - 1)
            except Superseded:
                pass
            else:
                raise Failed(f"{action.id}: a dispatch under fence {fence - 1}, after {fence}, was not refused")
            try:
                await self._revert(action, key, made, fence - 1)
            except Superseded:
                pass
            else:
                raise Failed(f"{action.id}: a revert under fence {fence - 1}, after {fence}, was not refused")
            seen = await self._inspect(action, key, made) if made and self.module.inspect_fn is not None else []
            if not all(i.exists and i.ours for i in seen):
                raise Failed(f"{action.id}: the refused revert removed what the key made")
            again = await self._dispatch(action, params, key, 3, fence)
            if sorted(str(r["ref"]) for r in again.resources) != sorted(r.ref for r in made):
                raise Failed(f"{action.id}: a retry under the same fence {fence} did not get the same answer")
        finally:
            failures = await self._revert(action, key, made, self._mint())
        if failures:
            raise Failed(f"{action.id}: reverting under a newer fence failed: {failures}")
        return Outcome.PASS, (
            f"{action.id}: dispatch and revert under {fence - 1} after {fence} refused (Superseded), "
            f"the same fence again accepted; leases not checked in process (fence 0)"
        )

    async def lease(self, lease: Lease) -> tuple[Outcome, str]:
        target = self.targets.get(lease.id, self.targets.get(lease.name))
        if lease.targeted and target is None:
            return Outcome.SKIP, "a targeted lease: give --target LEASE=TARGET"
        call = LeaseCall(lease.id, target, self.state, self.clock, idempotency_key=self._key(), run_id=0)
        original = await maybe_await(lease.read_fn(call))
        value = self.values.get(lease.id, self.values.get(lease.name, _other_value(lease, original)))
        assert lease.write_fn is not None
        try:
            await maybe_await(lease.write_fn(call, value))
            shown = await maybe_await(lease.read_fn(call))
            if shown != value:
                raise Failed(f"wrote {value!r}, read back {shown!r}")
        finally:
            await maybe_await((lease.restore_fn or lease.write_fn)(call, original))
        shown = await maybe_await(lease.read_fn(call))
        if shown != original:
            raise Failed(f"restored {original!r}, read back {shown!r}")
        return Outcome.PASS, f"read {original!r}, wrote and read back {value!r}, restored {original!r}"


def _other_value(lease: Lease, original: Any) -> Any:
    """A value the lease takes that differs from what the world shows."""
    schema = lease.value_schema or {}
    kind = schema.get("type")
    if kind in ("number", "integer"):
        low = schema.get("minimum", 0)
        high = schema.get("maximum", low + 100)
        middle = (low + high) // 2 if kind == "integer" else (low + high) / 2
        value = middle if middle != original else low
        return int(value) if kind == "integer" or float(value).is_integer() else value
    if kind == "boolean":
        return not original
    if "enum" in schema:
        return next((v for v in schema["enum"] if v != original), original)
    return "roadie conformance" if original != "roadie conformance" else "roadie conformance 2"
