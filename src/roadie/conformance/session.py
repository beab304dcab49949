"""A conformance session: what the rules share while they check one module server.

The `Session` talks to the module only through a `Transport`, retries what the engine
would retry under the same key, and remembers every key it dispatched and every value it
borrowed, so that the last rule can take all of it back down.

It sends every call that changes the world under a fence, as the engine does
(docs/protocol.md §4, rule 7): a key's dispatches under one fence minted for it (a retry
is the same claim), each revert under a newer one (a cleanup's claim comes later). A lease
target's writes all go under one fence per target: 2 (so that the stale-fence rule has a
lower one to send), or, when the module already holds a higher mark for that target (a
live world the engine has borrowed from), that mark, which it learns from the 412. It
never raises a lease target's mark above what it found there, so the engine's next
borrow is not refused because the kit was run.
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import ValidationError

from roadie import protocol
from roadie.conformance.transport import Kind, Transport, TransportFailed

# Retryable answers (409 in flight, 429 busy, 5xx) and transport failures are tried again
# under the same key, as the engine would; this many times, backing off to at most 1 s.
ATTEMPTS = 8
BACKOFF = 0.05

MAX_KIND = 64
MAX_REF = 190

# A lease target's fence when the module holds no higher mark: one above the lowest fence
# there is, so that the stale-fence rule can send a lower one.
LEASE_FENCE = 2
WRITES: frozenset[Kind] = frozenset({"dispatch", "revert", "lease.apply", "lease.restore"})


@dataclass(frozen=True)
class ConformanceOptions:
    """How to check a module.

    `params`: parameters per action name (else made from the action's JSON Schema).
    `targets`: a target per targeted lease (a targeted lease without one is skipped).
    `values`: the value to borrow per lease (else one of the same JSON type as it reads).
    `pull`: serve a work queue at the URL and check a module that polls it.
    `rules`: only these rules (the manifest and cleanup always run).
    `http_transport`: httpx's transport for push (an `httpx.ASGITransport` in tests).
    """

    params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    targets: Mapping[str, str] = field(default_factory=dict)
    values: Mapping[str, Any] = field(default_factory=dict)
    pull: bool = False
    module: str | None = None  # pull: the module's name, when more than one could announce
    concurrency: int = 10
    timeout: float = 30.0  # per call
    rule_timeout: float = 120.0
    announce_timeout: float = 60.0  # pull: how long to wait for the module to announce
    rules: Sequence[str] | None = None
    http_transport: httpx.AsyncBaseTransport | None = None


class Failed(Exception):
    """The module broke the rule; the message says how."""


class Skipped(Exception):
    """The rule does not apply to this module; the message says why."""


@dataclass
class Made:
    action: str
    resources: list[dict[str, Any]] = field(default_factory=list)


def message_of(body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message", ""))[:200]
    text = body if isinstance(body, str) else json.dumps(body, default=str)
    return text[:200]


def refs_of(resources: Sequence[Mapping[str, Any]]) -> list[str]:
    return [f"{r.get('kind')}:{r.get('ref')}" for r in resources]


def resource_problem(entry: Any) -> str | None:
    """Why the engine's ledger would drop this resource entry, or None (DESIGN §4.4)."""
    if not isinstance(entry, dict):
        return f"not an object: {entry!r:.60}"
    kind, ref, member = entry.get("kind"), entry.get("ref"), entry.get("memberKey")
    if not isinstance(kind, str) or not 1 <= len(kind) <= MAX_KIND:
        return f"kind must be a string of 1-{MAX_KIND} characters: {kind!r:.80}"
    if kind == "@step":
        return "kind '@step' is reserved for the engine"
    if not isinstance(ref, str) or not 1 <= len(ref) <= MAX_REF:
        return f"ref must be a string of 1-{MAX_REF} characters: {ref!r:.80}"
    if member is not None and (not isinstance(member, str) or len(member) > MAX_REF):
        return f"memberKey must be a string of at most {MAX_REF} characters"
    return None


class Session:
    """One conformance run's state: the manifest, the action under test, what was made."""

    def __init__(self, transport: Transport, options: ConformanceOptions) -> None:
        self.transport = transport
        self.options = options
        self.tag = secrets.token_hex(4)
        self.run_id = random.randint(1 << 30, (1 << 31) - 1)
        self._counter = 0
        self.manifest: protocol.Manifest | None = None
        self.action: protocol.ActionSpec | None = None
        self.params: dict[str, Any] = {}
        self.no_action = ""  # why there is no ledger action to test with
        self.made: dict[str, Made] = {}
        self.gone: list[tuple[str, list[dict[str, Any]]]] = []  # reverted by key: (key, resources)
        self.borrowed: dict[tuple[str, str | None], Any] = {}  # (lease, target) -> the value to restore
        self.kinds: set[str] = set()
        self._fence = 1  # the first minted is 2: a stale fence below any of them is still a fence
        self.key_fences: dict[str, int] = {}  # the fence of each key's last claim
        self.lease_fences: dict[str, int] = {}  # per lease target (`lease#target`)

    # -- keys and calls -------------------------------------------------------------

    def new_key(self, label: str) -> str:
        self._counter += 1
        return f"roadie-conformance-{self.tag}-{label}-{self._counter}"

    # -- fences ---------------------------------------------------------------------

    def mint_fence(self) -> int:
        """A fence higher than every one this session sent before."""
        self._fence += 1
        return self._fence

    def key_fence(self, key: str) -> int:
        """The fence `key`'s dispatches are sent under: minted at its first."""
        if key not in self.key_fences:
            self.key_fences[key] = self.mint_fence()
        return self.key_fences[key]

    def revert_fence(self, key: str) -> int:
        """A new claim, newer than the key's last: a cleanup's."""
        self.key_fences[key] = fence = self.mint_fence()
        return fence

    def lease_fence(self, lease: str, target: str | None) -> int:
        """The fence of every write of the kit's to a lease target (see the module's doc)."""
        return self.lease_fence_of(protocol.lease_fence_target(lease, target))

    def fenced(self, kind: Kind, body: Any) -> Any:
        """`body` with the fence it is sent under, unless it names one already."""
        if kind not in WRITES or not isinstance(body, dict) or "fence" in body:
            return body
        key = body.get("idempotency_key")
        if kind == "dispatch":
            fence = self.key_fence(str(key))
        elif kind == "revert":
            fence = self.revert_fence(str(key))
        else:
            fence = self.lease_fence(str(body.get("lease")), body.get("target"))
        return {**body, "fence": fence}

    def _learn_mark(self, kind: Kind, body: Any, status: int, answer: Any) -> bool:
        """A lease write of ours refused as superseded by a mark the module held before this
        session: take that mark as the target's fence (an equal fence is accepted)."""
        if kind not in ("lease.apply", "lease.restore") or not protocol.is_superseded(status, answer):
            return False
        mark = answer["error"].get("fence")
        target = protocol.lease_fence_target(str(body.get("lease")), body.get("target"))
        if not isinstance(mark, int) or isinstance(mark, bool) or mark <= self.lease_fence_of(target):
            return False
        self.lease_fences[target] = mark
        return True

    def lease_fence_of(self, target: str) -> int:
        return self.lease_fences.get(target, LEASE_FENCE)

    # -- calls ----------------------------------------------------------------------

    async def ask(self, kind: Kind, body: Any, *, retry: bool = True) -> tuple[int, Any]:
        """One call; retryable answers and transport failures are tried again, same key.
        A call that changes the world is sent under the session's fence for it (`fenced`),
        unless `body` names one."""
        chosen = isinstance(body, dict) and "fence" in body
        body = self.fenced(kind, body)
        status, answer = await self._ask(kind, body, retry=retry)
        if not chosen and self._learn_mark(kind, body, status, answer):
            status, answer = await self._ask(kind, self.fenced(kind, _unfenced(body)), retry=retry)
        return status, answer

    async def _ask(self, kind: Kind, body: Any, *, retry: bool) -> tuple[int, Any]:
        last = ""
        for attempt in range(1, ATTEMPTS + 1):
            try:
                status, answer = await self.transport.call(kind, body)
            except TransportFailed as exc:
                last = str(exc)
                if not retry or attempt == ATTEMPTS:
                    raise Failed(f"{kind}: the request failed ({last})") from exc
            else:
                if not retry or not protocol.retryable_status(status) or attempt == ATTEMPTS:
                    return status, answer
                last = f"{status} {message_of(answer)}"
            await asyncio.sleep(min(1.0, BACKOFF * 2 ** (attempt - 1)))
        raise AssertionError("unreachable")  # pragma: no cover

    async def ok(self, kind: Kind, body: Any, what: str) -> Any:
        status, answer = await self.ask(kind, body)
        if not 200 <= status < 300:
            raise Failed(f"{what}: answered {status}: {message_of(answer)}")
        return answer

    def need_action(self) -> protocol.ActionSpec:
        if self.action is None:
            raise Skipped(self.no_action or "no ledger action to test with")
        return self.action

    def dispatch_body(self, key: str, *, attempt: int = 1, fence: int | None = None) -> dict[str, Any]:
        """A dispatch of the action under test, under the key's fence unless given one."""
        action = self.need_action()
        return protocol.DispatchRequest(
            action=action.name,
            run_id=self.run_id,
            step_id=self._counter,
            idempotency_key=key,
            attempt=attempt,
            params=dict(self.params),
            fence=self.key_fence(key) if fence is None else fence,
        ).model_dump(mode="json")

    async def dispatch(self, key: str, *, attempt: int = 1, what: str = "dispatch") -> dict[str, Any]:
        """Dispatch the action under test; check the answer's shape; remember what it made."""
        action = self.need_action()
        made = self.made.setdefault(key, Made(action.name))
        body = self.dispatch_body(key, attempt=attempt)
        answer = await self.ok("dispatch", body, f"{what} {action.name} {json.dumps(self.params)}")
        if not isinstance(answer, dict) or not isinstance(answer.get("resources", []), list):
            raise Failed(f"{what}: the answer is not {{'resources': [...], 'output': ...}}: {message_of(answer)}")
        resources = answer.get("resources", [])
        for entry in resources:
            problem = resource_problem(entry)
            if problem is not None:
                raise Failed(f"{what}: a resource the engine's ledger would drop: {problem}")
        for entry in resources:
            if entry not in made.resources:
                made.resources.append(entry)
            self.kinds.add(entry["kind"])
        return answer

    async def made_something(self, key: str, what: str = "dispatch") -> list[dict[str, Any]]:
        resources: list[dict[str, Any]] = (await self.dispatch(key, what=what)).get("resources", [])
        if not resources:
            raise Skipped(
                f"{self.need_action().name} made no resources with params {json.dumps(self.params)}: "
                "give it --params that make something"
            )
        return resources

    def _wire(self, resources: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        return [dict(r) for r in resources]

    def revert_body(
        self, key: str, resources: Sequence[Mapping[str, Any]], *, fence: int | None = None
    ) -> dict[str, Any]:
        """A revert under a newer claim than the key's last, unless given a fence."""
        action = self.need_action()
        return protocol.RevertRequest.model_validate(
            {
                "action": action.name,
                "run_id": self.run_id,
                "idempotency_key": key,
                "resources": self._wire(resources),
                "fence": self.revert_fence(key) if fence is None else fence,
            }
        ).model_dump(mode="json", by_alias=True, exclude_none=True)

    async def revert(self, key: str, resources: Sequence[Mapping[str, Any]], what: str) -> protocol.RevertAnswer:
        answer = await self.ok("revert", self.revert_body(key, resources), what)
        try:
            return protocol.RevertAnswer.model_validate(answer or {})
        except ValidationError as exc:
            raise Failed(f"{what}: the answer is not {{'failures': [...]}}: {first_error(exc)}") from exc

    async def tagged(self, what: str, *, pages: int = 200) -> list[protocol.TaggedObject]:
        """Every object the module lists as tagged, page by page (at most `pages`)."""
        found: list[protocol.TaggedObject] = []
        after: str | None = None
        for _ in range(pages):
            body = protocol.TaggedRequest(after=after, limit=500).model_dump(mode="json")
            answer = await self.ok("tagged", body, what)
            try:
                page = protocol.TaggedAnswer.model_validate(answer)
            except ValidationError as exc:
                raise Failed(
                    f"{what}: the answer is not {{'objects': [{{kind, ref, key}}], 'next'}}: {first_error(exc)}"
                ) from exc
            found.extend(page.objects)
            if page.next is None or not page.objects:
                return found
            if page.next == after:
                raise Failed(f"{what}: 'next' did not move on from {after!r}: the listing would never end")
            after = page.next
        raise Failed(f"{what}: still more after {pages} pages of 500")

    async def inspect(self, key: str, resources: Sequence[Mapping[str, Any]], what: str) -> list[protocol.Inspected]:
        action = self.need_action()
        body = protocol.InspectRequest.model_validate(
            {"action": action.name, "run_id": self.run_id, "idempotency_key": key, "resources": self._wire(resources)}
        ).model_dump(mode="json", by_alias=True, exclude_none=True)
        answer = await self.ok("inspect", body, what)
        try:
            found = protocol.InspectAnswer.model_validate(answer).resources
        except ValidationError as exc:
            raise Failed(
                f"{what}: the answer is not {{'resources': [{{kind, ref, exists, ours}}]}}: {first_error(exc)}"
            ) from exc
        if len(found) != len(resources):
            raise Failed(f"{what}: asked after {len(resources)} resource(s), answered {len(found)}")
        for asked, got in zip(resources, found, strict=True):
            if (got.kind, got.ref) != (asked.get("kind"), asked.get("ref")):
                raise Failed(
                    f"{what}: answered {got.kind}:{got.ref} where {asked.get('kind')}:{asked.get('ref')} was asked"
                )
        return found

    def lease_body(
        self, lease: str, target: str | None, key: str, value: Any = None, *, run_id: int | None = None
    ) -> dict[str, Any]:
        """A lease call's body, without a fence: a read carries none, and `ask` gives a
        write the session's fence for the target."""
        return protocol.LeaseRequest(
            lease=lease, target=target, run_id=run_id or self.run_id, idempotency_key=key, value=value
        ).model_dump(mode="json", exclude={"fence"})

    async def lease_read(
        self, lease: str, target: str | None, key: str, what: str, *, run_id: int | None = None
    ) -> Any:
        answer = await self.ok("lease.read", self.lease_body(lease, target, key, run_id=run_id), what)
        try:
            return protocol.LeaseValue.model_validate(answer if answer is not None else {}).value
        except ValidationError as exc:
            raise Failed(f"{what}: the answer is not {{'value': ...}}: {first_error(exc)}") from exc


def _unfenced(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "fence"}


def first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error["loc"])
    return f"{where}: {error['msg']}" if where else str(error["msg"])
