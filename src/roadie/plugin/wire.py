"""What crosses the wire between a module server and the engine: the reply to one call,
refusals, manifests, answers and resources made JSON, and the parsing of request bodies.

Kept apart from `ModuleServer` so that the server holds the protocol's flow (signatures,
routing, the key ledger around each call) and this file the shapes it reads and writes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, is_dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from roadie import protocol
from roadie.errors import RegistryError, RoadieError
from roadie.registry.module import (
    Answer,
    Inspected,
    Lease,
    LeaseWriteFn,
    Module,
    Resource,
    RevertFailure,
    Tagged,
    TaggedPage,
)
from roadie.states import Reversible


@dataclass(frozen=True)
class Faults:
    """Misbehave on purpose, for the reliability tests (`roadie sandbox serve` flags).

    - `fail_first`: the first N dispatches answer a retryable 503 before acting.
    - `lose_answers`: with this probability a dispatch's answer is dropped after the
      dispatch was carried out and stored: push breaks the connection mid-response, pull
      never posts it. The engine sees a lost answer; the key ledger makes the retry exact.
    - `delay`: seconds every call waits (on the server's clock) before it is handled.
    - `seed`: of the random stream `lose_answers` draws from.
    """

    fail_first: int = 0
    lose_answers: float = 0.0
    delay: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.fail_first < 0:
            raise ValueError("fail_first cannot be negative")
        if not 0.0 <= self.lose_answers <= 1.0:
            raise ValueError(f"lose_answers must be a probability, got {self.lose_answers!r}")
        if self.delay < 0:
            raise ValueError("delay cannot be negative")


@dataclass
class Reply:
    """One call's answer: what a push server sends, and what a pull client posts back."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    lost: bool = False  # a `lose_answers` fault: carried out and stored, never delivered


class AnswerDropped(RoadieError):
    """The answer was dropped on purpose (the lose-answers fault knob): the call was carried
    out and its answer stored, and the connection was broken before the answer was sent."""


class Refusal(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        field: str | None = None,
        *,
        retryable: bool = False,
        headers: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.retryable = retryable
        self.headers = dict(headers or {})
        self.body = dict(body) if body is not None else None  # the whole error body, when not the usual one


# -- manifests and answers ---------------------------------------------------------------


def build_manifest(module: Module) -> protocol.Manifest:
    """The manifest of `module`: its actions with their classes and parameter JSON Schemas,
    its leases, and whether it answers inspect."""
    actions = []
    for action in module.actions.values():
        if action.reversible is Reversible.OVERRIDE:
            raise RegistryError(f"{action.id}: a remote module declares a lease, not an 'override' action")
        try:
            schema = action.params.model_json_schema()
        except Exception as exc:
            raise RegistryError(f"{action.id}: its parameters have no JSON Schema: {exc}") from exc
        actions.append(
            protocol.ActionSpec(
                name=action.name, reversible=action.reversible.value, description=action.description, params=schema
            )
        )
    leases = [
        protocol.LeaseSpec(
            name=lease.name,
            targeted=lease.targeted,
            stacks=lease.stacks,
            description=lease.description,
            value=lease.value_schema,
        )
        for lease in module.leases.values()
    ]
    return protocol.Manifest(
        module=module.name,
        description=module.description,
        actions=actions,
        leases=leases,
        inspect=module.inspect_fn is not None,
        tagged=module.tagged_fn is not None,
    )


def wire_resource(resource: Any) -> Any:
    """A resource as it crosses the wire: `{kind, ref, payload, memberKey}`."""
    if isinstance(resource, Resource):
        out: dict[str, Any] = {"kind": resource.kind, "ref": resource.ref, "payload": jsonable(resource.payload)}
        if resource.member_key is not None:
            out["memberKey"] = resource.member_key
        return out
    if isinstance(resource, BaseModel):
        return jsonable(resource.model_dump(mode="json", by_alias=True, exclude_none=True))
    if isinstance(resource, Mapping):
        out = {str(k): v for k, v in resource.items()}
        if "member_key" in out:
            member_key = out.pop("member_key")
            if member_key is not None:
                out.setdefault("memberKey", member_key)
        return jsonable(out)
    return jsonable(resource)  # not a resource: the engine refuses it, and says why


def wire_answer(raw: Any) -> Any:
    """What an action returned, as `{"resources": [...], "output": ...}`. Something that is
    not an answer is passed on as it is, so the engine refuses it as it would in-process."""
    if raw is None:
        return {"resources": [], "output": None}
    if isinstance(raw, Answer):
        resources, output = raw.resources, raw.output
    elif isinstance(raw, list):
        resources, output = raw, None
    elif isinstance(raw, dict) and set(raw) <= {"resources", "output"}:
        resources, output = raw.get("resources") or [], raw.get("output")
    else:
        return jsonable(raw)
    if not isinstance(resources, list):
        return {"resources": jsonable(resources), "output": jsonable(output)}
    return {"resources": [wire_resource(r) for r in resources], "output": jsonable(output)}


def jsonable(value: Any) -> Any:
    """`value` as JSON would carry it; what JSON cannot carry becomes its string."""
    if is_dataclass(value) and not isinstance(value, type):
        value = {k: getattr(value, k) for k in value.__dataclass_fields__}
    return json.loads(json.dumps(value, default=str))


def to_resource(entry: Mapping[str, Any]) -> Resource:
    member_key = entry.get("memberKey", entry.get("member_key"))
    return Resource(
        kind=str(entry.get("kind", "")),
        ref=str(entry.get("ref", "")),
        payload=entry.get("payload"),
        member_key=None if member_key is None else str(member_key),
    )


def to_failure(entry: Any) -> protocol.RevertFailureBody:
    if isinstance(entry, RevertFailure):
        return protocol.RevertFailureBody(kind=entry.kind, ref=entry.ref, message=entry.message)
    if isinstance(entry, Mapping):
        return protocol.RevertFailureBody(
            kind=str(entry.get("kind", "")), ref=str(entry.get("ref", "")), message=str(entry.get("message", ""))
        )
    raise RoadieError(f"revert answered a failure that is not one: {entry!r:.80}")


def to_inspected(entry: Any, resource: Resource) -> protocol.Inspected:
    if isinstance(entry, Inspected):
        return protocol.Inspected(kind=entry.kind, ref=entry.ref, exists=entry.exists, ours=entry.ours)
    if isinstance(entry, Mapping):
        exists = bool(entry.get("exists"))
        return protocol.Inspected(
            kind=str(entry.get("kind", resource.kind)),
            ref=str(entry.get("ref", resource.ref)),
            exists=exists,
            ours=exists and bool(entry.get("ours")),
        )
    raise RoadieError(f"inspect answered an entry that is not one: {entry!r:.80}")


def to_tagged_page(answer: Any) -> protocol.TaggedAnswer:
    """A module's `tagged` answer as it crosses the wire: a `TaggedPage`, or a bare list of
    `Tagged` (or mappings) for a module whose world fits on one page."""
    objects, after = (answer.objects, answer.next) if isinstance(answer, TaggedPage) else (answer or [], None)
    wired = []
    for entry in objects:
        if isinstance(entry, Tagged):
            entry = {"kind": entry.kind, "ref": entry.ref, "key": entry.key, "payload": jsonable(entry.payload)}
        if not isinstance(entry, Mapping):
            raise RoadieError(f"tagged answered an entry that is not one: {entry!r:.80}")
        wired.append(protocol.TaggedObject.model_validate(dict(entry)))
    return protocol.TaggedAnswer(objects=wired, next=after)


def lease_writer(lease: Lease) -> LeaseWriteFn:
    if lease.write_fn is None:  # Module.check() refused this at construction
        raise RoadieError(f"lease {lease.id} has no writer")
    return lease.write_fn


def parse_body(model: type[Any], body: bytes) -> Any:
    try:
        json.loads(body or b"null")
    except ValueError:
        raise Refusal(400, "malformed request: the body is not JSON") from None
    try:
        return model.model_validate_json(body or b"{}")
    except ValidationError as exc:
        message, where = first_error(exc)
        raise Refusal(400, f"malformed request: {message}", where or None) from None


def first_error(exc: ValidationError) -> tuple[str, str]:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return (f"{where}: {first['msg']}" if where else str(first["msg"])), where


def refused_reply(exc: Refusal) -> Reply:
    if exc.body is not None:
        return Reply(exc.status, exc.body, exc.headers)
    return Reply(exc.status, protocol.error_body(exc.message, retryable=exc.retryable, field=exc.field), exc.headers)


def superseded_error(message: str, mark: int | None = None) -> dict[str, Any]:
    """A 412's body when the module itself refused a stale fence (with its mark, where it
    said it)."""
    detail = protocol.ErrorDetail(message=message, field="fence", code="superseded", fence=mark)
    return protocol.ErrorBody(error=detail).model_dump(exclude_none=True)


def error_message(body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message", ""))
    return str(body)[:200]
