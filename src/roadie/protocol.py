"""The remote module protocol, version 2: paths, bodies, signatures, fences (docs/protocol.md).

Both transports carry the same bodies. In *push* the engine POSTs a body to the module
server's path; in *pull* the module fetches the same body from the engine's work queue,
with the path it would have been sent to, and posts its answer back.

Every request is signed in Standard Webhooks' headers: `webhook-signature` holds one
`v1,<base64>` HMAC-SHA256 per secret over `ID.TIMESTAMP.METHOD PATH\\nBODY`, where ID
is `webhook-id` (fresh per request), TIMESTAMP `webhook-timestamp` (Unix seconds) and
BODY the exact bytes sent. A request more than `MAX_SKEW` seconds away from the
receiver's clock is refused, and one whose id the receiver saw within that window is a
replay. Answers are signed under the id of the request they answer.

Every call that changes the world (dispatch, revert, lease apply and restore) carries a
`fence`: a number that only grows for what the call changes (the step's key, or the
lease target), minted by the engine's database each time an owner claims the right to
change it. A module refuses, with `SUPERSEDED`, a fence lower than one it has already
accepted for that target: the call comes from an owner whose claim has lapsed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import re
from collections.abc import AsyncIterable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from secrets import token_urlsafe
from typing import Annotated, Any, Literal, get_origin

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from standardwebhooks import Webhook

from roadie.clock import Clock, SystemClock
from roadie.errors import RoadieError

VERSION: Literal["roadie/v2"] = "roadie/v2"
PREFIX = "/roadie/v2"
# Version 1 had no fences and signed no request line: its paths are answered RETIRED,
# with one line saying what to change.
RETIRED_PREFIX = "/roadie/v1"
RETIRED = 410
V1_RETIRED = (
    "roadie/v1 is retired: Roadie speaks roadie/v2 (paths /roadie/v2/..., the method and path signed, "
    "fences on dispatch, revert, lease apply and restore); see docs/protocol.md, 'From roadie/v1'"
)
SUPERSEDED = 412  # a module's answer to a call whose fence is older than one it accepted
MAX_FENCE = 2**53 - 1  # JSON encoders that keep numbers as doubles keep integers up to here
MAX_SKEW = 300.0  # seconds
# What a receiver takes, checked before it reads a body (docs/protocol.md §1, "Limits"):
# room for an answer listing MAX_RESOURCES resources with payloads.
MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_RESOURCES = 10_000  # in one answer (a dispatch's, a report's)

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
# Standard Webhooks 1.0's headers (docs/protocol.md §1 says where Roadie differs).
H_ID = "webhook-id"
H_TIMESTAMP = "webhook-timestamp"
H_SIGNATURE = "webhook-signature"
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
    """The request's (or answer's) signature was missing, wrong, stale or replayed."""


# -- secrets -------------------------------------------------------------------------------

Secrets = str | Sequence[str]
"""One secret, or several during a rotation: every one of them signs, any one of them verifies."""

_SECRET_PREFIX = "whsec_"


def secret_list(secrets: Secrets) -> list[str]:
    """The secrets of `secrets`: a sequence as given; a string of `whsec_` secrets split on
    whitespace, so one setting (an environment variable, a Luanti setting) can hold a new
    and an old one. Any other string is one secret, spaces and all (split, a pass phrase
    would become several weak secrets, any of them accepted). A string that holds a
    `whsec_` secret among other words is refused: whether it is one pass phrase or a
    rotation cannot be told, and either reading would hold a secret the other side lacks."""
    if isinstance(secrets, str):
        parts = secrets.split()
        whsec = [p for p in parts if p.startswith(_SECRET_PREFIX)]
        if whsec and len(whsec) < len(parts):
            raise ValueError(
                "a whsec_ secret among other words: give whsec_ secrets alone, one plain secret, or a list"
            )
        found = parts if whsec else [secrets.strip()]
        found = [s for s in found if s]
    else:
        found = [s for s in secrets if s]
    if not found:
        raise ValueError("no secret given")
    return found


def secret_bytes(secret: str) -> bytes:
    """The HMAC key of one secret: a Standard Webhooks secret (`whsec_` and base64) is its
    decoded bytes; any other string its UTF-8 bytes."""
    if secret.startswith(_SECRET_PREFIX):
        try:
            key = base64.b64decode(secret[len(_SECRET_PREFIX) :], validate=True)
        except binascii.Error as exc:
            raise ValueError("a whsec_ secret is base64 after its prefix") from exc
        if not key:
            raise ValueError("a whsec_ secret holds no key")
        return key
    return secret.encode()


def new_secret() -> str:
    """A fresh Standard Webhooks secret: `whsec_` and 32 random bytes in base64."""
    return _SECRET_PREFIX + base64.b64encode(os.urandom(32)).decode()


# -- requests ------------------------------------------------------------------------------

_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def is_request_id(value: str) -> bool:
    """Whether `value` may be a `webhook-id`: 1-64 letters, digits, `_` and `-`."""
    return bool(_ID.match(value))


def new_id() -> str:
    """A request id nobody has used: `msg_` and 22 random URL-safe characters."""
    return "msg_" + token_urlsafe(16)


def _payload(request_line: str, body: bytes) -> bytes:
    return request_line.encode() + b"\n" + body


def signature(secret: str, request_id: str, timestamp: str, method: str, path: str, body: bytes) -> str:
    """One `v1,<base64>` entry: HMAC-SHA256 keyed with `secret`, over
    `ID.TIMESTAMP.METHOD PATH\\nBODY` (Standard Webhooks' content, its payload the request
    line and the body)."""
    # Standard Webhooks' own signer, given the payload with the method and path in front.
    content = _payload(f"{method.upper()} {path}", body)
    return Webhook(secret_bytes(secret)).sign(request_id, _utc(timestamp), content)


def _utc(timestamp: str) -> datetime:
    return datetime.fromtimestamp(int(timestamp), tz=UTC)


def _signatures(secrets: Secrets, request_id: str, timestamp: str, method: str, path: str, body: bytes) -> str:
    return " ".join(signature(s, request_id, timestamp, method, path, body) for s in secret_list(secrets))


def sign(
    secrets: Secrets,
    method: str,
    path: str,
    body: bytes,
    *,
    key: str = NO_KEY,
    module: str | None = None,
    now: float | None = None,
    clock: Clock | None = None,
    request_id: str | None = None,
) -> dict[str, str]:
    """The headers that sign one request, under a fresh id (or `request_id`), timestamped
    by `now` or `clock` (the system's), with one signature per secret."""
    request_id = request_id or new_id()
    timestamp = str(int(_seconds(now, clock)))
    headers = {
        H_ID: request_id,
        H_TIMESTAMP: timestamp,
        H_SIGNATURE: _signatures(secrets, request_id, timestamp, method, path, body),
        H_KEY: key,
        "Content-Type": "application/json",
    }
    if module is not None:
        headers[H_MODULE] = module
    return headers


@dataclass(frozen=True)
class Signed:
    """What a verified request's headers said: its id, and when it was sent (Unix seconds)."""

    id: str
    sent: float


def verify(
    secrets: Secrets,
    method: str,
    path: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: float | None = None,
    max_skew: float = MAX_SKEW,
    clock: Clock | None = None,
) -> Signed:
    """Refuse an unsigned, wrongly signed or stale request, saying which; staleness is
    judged on `now` or `clock` (the system's). Whether its id was seen before is the
    receiver's to ask, of storage that outlives it (the gateway's table, the SDK's key
    ledger), keeping the id until `sent + max_skew`."""
    given = _header(headers, H_SIGNATURE)
    request_id = _header(headers, H_ID)
    timestamp = _header(headers, H_TIMESTAMP)
    if not given:
        raise SignatureRefused(f"unsigned request: no {H_SIGNATURE} header")
    if not request_id:
        raise SignatureRefused(f"no {H_ID} header")
    if not _ID.match(request_id):
        raise SignatureRefused(f"{H_ID} is not 1-64 letters, digits, '_' or '-': {request_id[:70]!r}")
    if not timestamp:
        raise SignatureRefused(f"no {H_TIMESTAMP} header")
    if not timestamp.isdigit() or len(timestamp) > 12:
        raise SignatureRefused(f"{H_TIMESTAMP} is not whole Unix seconds: {timestamp[:40]!r}")
    skew = abs(_seconds(now, clock) - int(timestamp))
    if skew > max_skew:
        raise SignatureRefused(
            f"stale request: its timestamp is {skew:.0f}s away from this clock (limit {max_skew:.0f}s)"
        )
    offered = [entry.encode() for entry in given.split()]
    for secret in secret_list(secrets):
        expected = signature(secret, request_id, timestamp, method, path, body).encode()
        # Every offered entry is compared, whatever matched before it: constant time.
        if any([hmac.compare_digest(expected, entry) for entry in offered]):
            return Signed(request_id, float(timestamp))
    raise SignatureRefused("wrong signature: not made with this module's secret over this method, path and body")


REPLAYED = f"replayed request: its {H_ID} was seen before"


# -- answers -------------------------------------------------------------------------------

# An answer that carries work or a result is signed too, with the same secrets, under the
# id of the request it answers and with ANSWER in the method's place: no request's
# signature passes for an answer's, and no answer passes for another request's.
ANSWER_METHOD = "ANSWER"


def sign_answer(
    secrets: Secrets, request_id: str, path: str, body: bytes, *, now: float | None = None, clock: Clock | None = None
) -> dict[str, str]:
    """The headers that sign the answer to request `request_id`, made for `path`."""
    headers = sign(secrets, ANSWER_METHOD, path, body, now=now, clock=clock, request_id=request_id)
    del headers[H_KEY]
    return headers


def verify_answer(
    secrets: Secrets,
    request_id: str,
    path: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: float | None = None,
    max_skew: float = MAX_SKEW,
    clock: Clock | None = None,
) -> None:
    """Refuse an answer to request `request_id` (for `path`) that the other side did not
    sign, or signed for another request."""
    answered = _header(headers, H_ID)
    if _header(headers, H_SIGNATURE) and answered != request_id:
        raise SignatureRefused(f"answer to another request: its {H_ID} is {answered[:70]!r}, not {request_id!r}")
    try:
        verify(secrets, ANSWER_METHOD, path, headers, body, now=now, max_skew=max_skew, clock=clock)
    except SignatureRefused as exc:
        raise SignatureRefused(exc.message.replace("request", "answer", 1)) from None


def features(headers: Mapping[str, str]) -> frozenset[str]:
    """What a poll asked for in `X-Roadie-Features` (comma-separated, any case)."""
    return frozenset(part.strip().lower() for part in _header(headers, H_FEATURES).split(",") if part.strip())


def wants_tokens(headers: Mapping[str, str]) -> bool:
    """Whether a poll asked for delivery tokens (`X-Roadie-Features: delivery-token`)."""
    return FEATURE_TOKENS in features(headers)


def signed_body(
    secrets: Secrets,
    request_id: str,
    path: str,
    answer: Any,
    *,
    now: float | None = None,
    clock: Clock | None = None,
) -> bytes:
    """`answer` (JSON-able) with its signature inside: a `SignedAnswer` whose `answer` is
    its JSON text. What is signed is the text the module reads back out of it, so that
    text is ASCII (JSON escapes the rest) and no decoder can change a byte of it."""
    text = json.dumps(answer, ensure_ascii=True, separators=(",", ":"))
    headers = sign_answer(secrets, request_id, path, text.encode(), now=now, clock=clock)
    signed = SignedAnswer(id=headers[H_ID], timestamp=headers[H_TIMESTAMP], signature=headers[H_SIGNATURE], answer=text)
    return signed.model_dump_json().encode()


def open_signed_body(
    secrets: Secrets,
    request_id: str,
    path: str,
    raw: bytes,
    *,
    now: float | None = None,
    max_skew: float = MAX_SKEW,
    clock: Clock | None = None,
) -> bytes:
    """The answer inside a `SignedAnswer`, refused as `verify_answer` refuses one whose
    signature is missing, wrong, stale or made for another request."""
    try:
        signed = SignedAnswer.model_validate_json(raw)
    except ValueError as exc:
        raise SignatureRefused("unsigned answer: the body is no signed answer") from exc
    headers = {H_ID: signed.id, H_TIMESTAMP: signed.timestamp, H_SIGNATURE: signed.signature}
    body = signed.answer.encode()
    verify_answer(secrets, request_id, path, headers, body, now=now, max_skew=max_skew, clock=clock)
    return body


async def read_capped(chunks: AsyncIterable[bytes], declared: str | None, limit: int = MAX_BODY_BYTES) -> bytes | None:
    """A body read from `chunks`, or None when it is over `limit` bytes: by its declared
    Content-Length, before a byte is read, or as soon as more came than the limit."""
    if declared and declared.isdigit() and int(declared) > limit:
        return None
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)


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
    protocol: str = VERSION
    module: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    description: str = ""
    actions: list[ActionSpec] = Field(default_factory=list)
    leases: list[LeaseSpec] = Field(default_factory=list)
    inspect: bool = Field(False, description="whether the server answers /inspect")
    tagged: bool = Field(False, description="whether the server answers /tagged: what it holds tagged with keys")

    @field_validator("protocol")
    @classmethod
    def _speaks_this_version(cls, value: str) -> str:
        if value == "roadie/v1":
            raise ValueError(V1_RETIRED)
        if value != VERSION:
            raise ValueError(f"unknown protocol {value!r}: Roadie speaks {VERSION}")
        return value


Fence = Annotated[int, Field(ge=1, le=MAX_FENCE, description="only grows for what the call changes")]


class DispatchRequest(_Body):
    action: str
    run_id: int
    step_id: int
    idempotency_key: str = Field(min_length=1, max_length=190)
    attempt: int = Field(ge=1)
    params: dict[str, Any] = Field(default_factory=dict)
    fence: Fence


class RevertRequest(_Body):
    action: str
    run_id: int
    idempotency_key: str = Field(min_length=1, max_length=190)
    resources: list[WireResource] = Field(default_factory=list, description="empty: whatever this key made")
    fence: Fence


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
    """lease/read (no value, no fence), lease/apply and lease/restore (the value to write,
    and the fence of the owner writing it)."""

    lease: str
    target: str | None = None
    run_id: int
    idempotency_key: str = Field(min_length=1, max_length=190)
    value: Any = None
    fence: Fence | None = None

    @property
    def fence_target(self) -> str:
        """What a lease call's fence is counted for: the lease and its target."""
        return lease_fence_target(self.lease, self.target)


class LeaseValue(_Body):
    value: Any = None


class ReportRequest(_Body):
    """Resources a step's effect made by itself afterwards, against the step's key."""

    idempotency_key: str = Field(min_length=1, max_length=190)
    resources: list[dict[str, Any]] = Field(min_length=1, max_length=MAX_RESOURCES)


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
    """An answer carrying its own signature (`signed-body`): `id`, `timestamp` and
    `signature` are what its headers would be, signed over `answer`."""

    id: str = Field(description="the id of the request this answers")
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
    code: str | None = Field(None, description='"superseded" on a 412: the call\'s fence is older than the mark')
    fence: int | None = Field(None, description="on a superseded call: the highest fence accepted for its target")


class ErrorBody(_Body):
    error: ErrorDetail


def error_body(message: str, *, retryable: bool = False, field: str | None = None) -> dict[str, Any]:
    return ErrorBody(error=ErrorDetail(message=message, retryable=retryable, field=field)).model_dump(exclude_none=True)


def superseded_body(target: str, fence: int, mark: int) -> dict[str, Any]:
    """The answer to a call whose fence is older than one accepted for its target."""
    detail = ErrorDetail(
        message=f"fence {fence} is older than fence {mark}, already accepted for {target}: a newer owner has acted",
        field="fence",
        code="superseded",
        fence=mark,
    )
    return ErrorBody(error=detail).model_dump(exclude_none=True)


def lease_fence_target(lease: str, target: str | None) -> str:
    """The name a lease's fence is counted under: `lease#target`, or the lease alone."""
    return lease if target is None else f"{lease}#{target}"


def is_superseded(status: int, body: Any) -> bool:
    """Whether an answer refuses a call as superseded by a newer owner's fence."""
    if status != SUPERSEDED or not isinstance(body, dict):
        return False
    error = body.get("error")
    return isinstance(error, dict) and error.get("code") == "superseded"


def retryable_status(status: int) -> bool:
    """Which answers may pass on a retry: 5xx, 429 (busy), 409 (the same key is in flight)."""
    return status >= 500 or status in (408, 409, 425, 429)
