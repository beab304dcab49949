"""The remote module protocol, version 1: paths, bodies, signatures (docs/protocol.md).

Both transports carry the same bodies. In *push* the engine POSTs a body to the module
server's path; in *pull* the module fetches the same body from the engine's work queue,
with the path it would have been sent to, and posts its answer back.

Every request is signed: `X-Roadie-Signature: v1=<hex>` is HMAC-SHA256, with the
module's shared secret, over `METHOD \\n PATH \\n TIMESTAMP \\n BODY`, where TIMESTAMP is
`X-Roadie-Timestamp` (Unix seconds) and BODY the exact bytes sent. A request more than
`MAX_SKEW` seconds away from the receiver's clock is refused, so a captured request
cannot be replayed later.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable, Mapping
from typing import Any, Literal, get_origin

from pydantic import BaseModel, ConfigDict, Field, model_validator

from roadie.clock import Clock, SystemClock
from roadie.errors import RoadieError

VERSION: Literal["roadie/v1"] = "roadie/v1"
PREFIX = "/roadie/v1"
MAX_SKEW = 300.0  # seconds

# Module server paths (push), and the kinds of call a pulled work item names.
MANIFEST = f"{PREFIX}/manifest"
DISPATCH = f"{PREFIX}/dispatch"
REVERT = f"{PREFIX}/revert"
INSPECT = f"{PREFIX}/inspect"
TAGGED = f"{PREFIX}/tagged"
LEASE_READ = f"{PREFIX}/lease/read"
LEASE_APPLY = f"{PREFIX}/lease/apply"
LEASE_RESTORE = f"{PREFIX}/lease/restore"
CALL_PATHS = {
    "dispatch": DISPATCH,
    "revert": REVERT,
    "inspect": INSPECT,
    "tagged": TAGGED,
    "lease.read": LEASE_READ,
    "lease.apply": LEASE_APPLY,
    "lease.restore": LEASE_RESTORE,
}
CallKind = Literal["dispatch", "revert", "inspect", "tagged", "lease.read", "lease.apply", "lease.restore"]

# Engine (gateway) paths: what a module calls.
PULL = f"{PREFIX}/pull"
ANSWER = f"{PREFIX}/answer"
REPORT = f"{PREFIX}/report"
ANNOUNCE = f"{PREFIX}/announce"

H_KEY = "X-Roadie-Key"
H_MODULE = "X-Roadie-Module"
H_TIMESTAMP = "X-Roadie-Timestamp"
H_SIGNATURE = "X-Roadie-Signature"
NO_KEY = "-"  # the key header of a request that is about no step (manifest, pull)
# A poll that sends `X-Roadie-Features: delivery-token` gets each call's delivery token,
# and names it when it answers. Opt-in, because modules written before tokens refuse a
# field they do not know.
H_FEATURES = "X-Roadie-Features"
FEATURE_TOKENS = "delivery-token"
# A poll that sends `X-Roadie-Features: signed-body` gets its answer's signature inside the
# body (`SignedAnswer`), for HTTP clients that show no response headers (Luanti's).
FEATURE_SIGNED_BODY = "signed-body"

_SYSTEM_CLOCK = SystemClock()


def _seconds(now: float | None, clock: Clock | None) -> float:
    """Unix seconds: `now` when given, else the injectable clock's time (DESIGN §9), so a
    test that moves its clock signs and checks on the time it set."""
    if now is not None:
        return now
    return (clock or _SYSTEM_CLOCK).now().timestamp()


class SignatureRefused(RoadieError):
    """The request's signature was missing, wrong or stale."""


def _canonical(method: str, path: str, timestamp: str, body: bytes) -> bytes:
    return b"\n".join([method.upper().encode(), path.encode(), timestamp.encode(), body])


def signature(secret: str, method: str, path: str, timestamp: str, body: bytes) -> str:
    digest = hmac.new(secret.encode(), _canonical(method, path, timestamp, body), hashlib.sha256).hexdigest()
    return f"v1={digest}"


def sign(
    secret: str,
    method: str,
    path: str,
    body: bytes,
    *,
    key: str = NO_KEY,
    module: str | None = None,
    now: float | None = None,
    clock: Clock | None = None,
) -> dict[str, str]:
    """The headers that sign one request, timestamped by `now` or `clock` (the system's)."""
    timestamp = str(int(_seconds(now, clock)))
    headers = {
        H_KEY: key,
        H_TIMESTAMP: timestamp,
        H_SIGNATURE: signature(secret, method, path, timestamp, body),
        "Content-Type": "application/json",
    }
    if module is not None:
        headers[H_MODULE] = module
    return headers


def verify(
    secret: str,
    method: str,
    path: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: float | None = None,
    max_skew: float = MAX_SKEW,
    clock: Clock | None = None,
) -> None:
    """Refuse an unsigned, wrongly signed or stale request, saying which; staleness is
    judged on `now` or `clock` (the system's)."""
    given = _header(headers, H_SIGNATURE)
    timestamp = _header(headers, H_TIMESTAMP)
    if not given:
        raise SignatureRefused(f"unsigned request: no {H_SIGNATURE} header")
    if not timestamp:
        raise SignatureRefused(f"no {H_TIMESTAMP} header")
    try:
        sent = float(timestamp)
    except ValueError:
        raise SignatureRefused(f"{H_TIMESTAMP} is not Unix seconds: {timestamp[:40]!r}") from None
    skew = abs(_seconds(now, clock) - sent)
    if skew > max_skew:
        raise SignatureRefused(
            f"stale request: its timestamp is {skew:.0f}s away from this clock (limit {max_skew:.0f}s)"
        )
    if not hmac.compare_digest(given.encode(), signature(secret, method, path, timestamp, body).encode()):
        raise SignatureRefused("wrong signature: not made with this module's secret over this method, path and body")


# The gateway's answer to a poll carries work the module will carry out, so it is signed
# too: with the same secret and headers, over `ANSWER \n PATH \n TIMESTAMP \n BODY`. The
# word ANSWER in the method's place means no request's signature can pass for an answer's.
ANSWER_METHOD = "ANSWER"


def sign_answer(
    secret: str, path: str, body: bytes, *, now: float | None = None, clock: Clock | None = None
) -> dict[str, str]:
    """The headers that sign the answer to a request for `path`."""
    headers = sign(secret, ANSWER_METHOD, path, body, now=now, clock=clock)
    del headers[H_KEY]
    return headers


def verify_answer(
    secret: str,
    path: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: float | None = None,
    max_skew: float = MAX_SKEW,
    clock: Clock | None = None,
) -> None:
    """Refuse an answer to a request for `path` that the other side did not sign."""
    verify(secret, ANSWER_METHOD, path, headers, body, now=now, max_skew=max_skew, clock=clock)


def features(headers: Mapping[str, str]) -> frozenset[str]:
    """What a poll asked for in `X-Roadie-Features` (comma-separated, any case)."""
    return frozenset(part.strip().lower() for part in _header(headers, H_FEATURES).split(",") if part.strip())


def wants_tokens(headers: Mapping[str, str]) -> bool:
    """Whether a poll asked for delivery tokens (`X-Roadie-Features: delivery-token`)."""
    return FEATURE_TOKENS in features(headers)


def signed_body(secret: str, path: str, answer: Any, *, now: float | None = None, clock: Clock | None = None) -> bytes:
    """`answer` (JSON-able) with its signature inside: a `SignedAnswer` whose `answer` is
    its JSON text. What is signed is the text the module reads back out of it, so that
    text is ASCII (JSON escapes the rest) and no decoder can change a byte of it."""
    text = json.dumps(answer, ensure_ascii=True, separators=(",", ":"))
    headers = sign_answer(secret, path, text.encode(), now=now, clock=clock)
    signed = SignedAnswer(timestamp=headers[H_TIMESTAMP], signature=headers[H_SIGNATURE], answer=text)
    return signed.model_dump_json().encode()


def open_signed_body(
    secret: str,
    path: str,
    raw: bytes,
    *,
    now: float | None = None,
    max_skew: float = MAX_SKEW,
    clock: Clock | None = None,
) -> bytes:
    """The answer inside a `SignedAnswer`, refused as `verify_answer` refuses one whose
    signature is missing, wrong or stale."""
    try:
        signed = SignedAnswer.model_validate_json(raw)
    except ValueError as exc:
        raise SignatureRefused("unsigned answer: the body is no signed answer") from exc
    headers = {H_TIMESTAMP: signed.timestamp, H_SIGNATURE: signed.signature}
    body = signed.answer.encode()
    verify_answer(secret, path, headers, body, now=now, max_skew=max_skew, clock=clock)
    return body


def _header(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name)
    if value is None:
        value = headers.get(name.lower())
    return value or ""


def body_hash(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


# -- bodies ------------------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _null_as_empty(cls, data: Any) -> Any:
        """Some JSON encoders (Luanti's) write an empty array or object as `null`: a null
        where a list or an object is expected reads as an empty one. (An integer written
        as `1.0` already reads as 1.)"""
        if not isinstance(data, dict):
            return data
        for name, field in cls.model_fields.items():
            key = field.alias or name
            if key in data and data[key] is None:
                empty = _EMPTY.get(get_origin(field.annotation) or field.annotation)
                if empty is not None:
                    data = {**data, key: empty()}
        return data


_EMPTY: dict[Any, Callable[[], Any]] = {list: list, dict: dict}


class WireResource(BaseModel):
    """A resource as it crosses the wire. `memberKey` scopes cleanup to one participant."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    kind: str
    ref: str
    payload: Any = None
    member_key: str | None = Field(None, alias="memberKey")


class ActionSpec(_Body):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    reversible: Literal["none", "self", "ledger"]
    description: str = ""
    params: dict[str, Any] = Field(default_factory=lambda: {"type": "object"}, description="a JSON Schema")


class LeaseSpec(_Body):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    targeted: bool = False
    stacks: bool = Field(False, description="several runs may borrow it at once, each a layer with a priority")
    description: str = ""
    value: dict[str, Any] | None = Field(None, description="a JSON Schema of the values it takes (none: any)")


class Manifest(_Body):
    protocol: Literal["roadie/v1"] = VERSION
    module: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    description: str = ""
    actions: list[ActionSpec] = Field(default_factory=list)
    leases: list[LeaseSpec] = Field(default_factory=list)
    inspect: bool = Field(False, description="whether the server answers /inspect")
    tagged: bool = Field(False, description="whether the server answers /tagged: what it holds tagged with keys")


class DispatchRequest(_Body):
    action: str
    run_id: int
    step_id: int
    idempotency_key: str = Field(min_length=1, max_length=190)
    attempt: int = Field(ge=1)
    params: dict[str, Any] = Field(default_factory=dict)


class RevertRequest(_Body):
    action: str
    run_id: int
    idempotency_key: str = Field(min_length=1, max_length=190)
    resources: list[WireResource] = Field(default_factory=list, description="empty: whatever this key made")


class RevertFailureBody(_Body):
    kind: str
    ref: str
    message: str


class RevertAnswer(_Body):
    failures: list[RevertFailureBody] = Field(default_factory=list)


class InspectRequest(_Body):
    action: str
    run_id: int
    idempotency_key: str = Field(min_length=1, max_length=190)
    resources: list[WireResource]


class Inspected(_Body):
    kind: str
    ref: str
    exists: bool
    ours: bool = Field(description="it still carries this key's tag")


class InspectAnswer(_Body):
    resources: list[Inspected]


class TaggedRequest(_Body):
    """A page of the objects the module holds tagged with Roadie keys, after `after`."""

    after: str | None = Field(None, max_length=500, description="the `next` of the page before; null: the first")
    limit: int = Field(500, ge=1, le=5000)


class TaggedObject(_Body):
    kind: str = Field(min_length=1, max_length=64)
    ref: str = Field(min_length=1, max_length=190)
    key: str = Field(min_length=1, max_length=190, description="the idempotency key it is tagged with")
    payload: Any = None


class TaggedAnswer(_Body):
    objects: list[TaggedObject]
    next: str | None = Field(None, max_length=500, description="where the next page begins; null: this was the last")


class LeaseRequest(_Body):
    """lease/read (no value), lease/apply and lease/restore (the value to write)."""

    lease: str
    target: str | None = None
    run_id: int
    idempotency_key: str = Field(min_length=1, max_length=190)
    value: Any = None


class LeaseValue(_Body):
    value: Any = None


class ReportRequest(_Body):
    """Resources a step's effect made by itself afterwards, against the step's key."""

    idempotency_key: str = Field(min_length=1, max_length=190)
    resources: list[dict[str, Any]] = Field(min_length=1)


class ReportAnswer(_Body):
    recorded: int
    rejected: list[str] = Field(default_factory=list)


class PullRequest(_Body):
    max: int = Field(16, ge=1, le=256)
    wait: float = Field(20.0, ge=0, le=60, description="seconds to hold the poll open when there is no work")


class PulledCall(_Body):
    id: int
    kind: CallKind
    path: str
    idempotency_key: str
    body: dict[str, Any]
    delivery: int = Field(description="1 the first time this call is handed out, 2 after a visibility timeout...")
    token: str | None = Field(
        None, description="this delivery's token, minted per hand-out; sent to polls that ask for it"
    )


class PullAnswer(_Body):
    calls: list[PulledCall]


class SignedAnswer(_Body):
    """An answer carrying its own signature (`signed-body`): `signature` is made as the
    headers' would be, over `ANSWER \\n PATH \\n timestamp \\n answer`."""

    timestamp: str
    signature: str
    answer: str = Field(description="the answer itself, as JSON text")


class AnswerPost(_Body):
    """A pulled call's answer: the HTTP status and body a push server would have sent."""

    id: int
    status: int = Field(ge=100, le=599)
    body: Any = None
    token: str | None = Field(None, description="the delivery's token, when the call came with one")


class ErrorDetail(_Body):
    message: str
    retryable: bool = False
    field: str | None = None


class ErrorBody(_Body):
    error: ErrorDetail


def error_body(message: str, *, retryable: bool = False, field: str | None = None) -> dict[str, Any]:
    return ErrorBody(error=ErrorDetail(message=message, retryable=retryable, field=field)).model_dump(exclude_none=True)


def retryable_status(status: int) -> bool:
    """Which answers may pass on a retry: 5xx, 429 (busy), 409 (the same key is in flight)."""
    return status >= 500 or status in (408, 409, 425, 429)
