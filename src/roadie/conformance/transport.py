"""How the conformance checks reach a module: one small interface over either transport.

A check asks for one call (`call(kind, body)`) and gets back the status and parsed body a
push server would have answered. `PushClient` POSTs signed requests to a module server, and
can also send raw, deliberately wrong requests (`send_raw`) for the signature and
malformed-body rules. The pull side (`roadie.conformance.pull`) puts the same bodies on a
work queue that the module polls; it cannot send a module raw bytes, so the rules that
need them are checked differently there.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal, Protocol, runtime_checkable

import httpx

from roadie import protocol

Kind = Literal["manifest", "dispatch", "revert", "inspect", "tagged", "lease.read", "lease.apply", "lease.restore"]


class Transport(Protocol):
    """What the checks need of a transport."""

    mode: str  # "push" or "pull"

    async def call(self, kind: Kind, body: Any, *, headers: Mapping[str, str] | None = None) -> tuple[int, Any]:
        """Send one call, signed; answer the status and the parsed body (the raw text when
        it is not JSON). Extra `headers` are sent over the signed ones. Transport failures
        (refused, reset, timed out, no answer in time) raise `TransportFailed`."""
        ...

    async def aclose(self) -> None: ...


@runtime_checkable
class RawTransport(Transport, Protocol):
    async def send_raw(self, method: str, path: str, content: bytes, headers: Mapping[str, str]) -> tuple[int, Any]:
        """Send exactly these bytes and headers, unsigned unless the headers sign them."""
        ...

    def signed(self, method: str, path: str, content: bytes, key: str, *, now: float | None = None) -> dict[str, str]:
        """The headers that sign these bytes with the module's secret."""
        ...

    secret: protocol.Secrets
    answer_headers: Mapping[str, str]  # of the last answer `send_raw` got
    answer_bytes: bytes


class TransportFailed(Exception):
    """The call got no answer: the connection was refused, reset or timed out. Retryable."""


def path_of(kind: Kind) -> str:
    return protocol.MANIFEST if kind == "manifest" else protocol.CALL_PATHS[kind]


def key_of(body: Any) -> str:
    if isinstance(body, Mapping):
        key = body.get("idempotency_key")
        if isinstance(key, str) and key:
            return key
    return protocol.NO_KEY


def parse(response: httpx.Response) -> Any:
    try:
        return response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return response.text


class PushClient:
    """Signed requests to a module server at `url`.

    `transport` is httpx's (an `httpx.ASGITransport` serves an app in-process, for tests).
    """

    mode = "push"

    def __init__(
        self,
        url: str,
        secret: str,
        *,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.secret = secret
        self.answer_headers: Mapping[str, str] = {}
        self.answer_bytes = b""
        self.client = httpx.AsyncClient(
            base_url=self.url,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0)),
            transport=transport,
            limits=httpx.Limits(max_connections=64),
        )

    def signed(self, method: str, path: str, content: bytes, key: str, *, now: float | None = None) -> dict[str, str]:
        return protocol.sign(self.secret, method, path, content, key=key, now=now)

    async def call(self, kind: Kind, body: Any, *, headers: Mapping[str, str] | None = None) -> tuple[int, Any]:
        method = "GET" if kind == "manifest" else "POST"
        path = path_of(kind)
        content = b"" if kind == "manifest" else json.dumps(body).encode()
        sent = self.signed(method, path, content, key_of(body))
        sent.update(headers or {})
        return await self.send_raw(method, path, content, sent)

    async def send_raw(self, method: str, path: str, content: bytes, headers: Mapping[str, str]) -> tuple[int, Any]:
        try:
            response = await self.client.request(method, path, content=content, headers=dict(headers))
        except httpx.TransportError as exc:
            raise TransportFailed(f"{type(exc).__name__}: {exc}") from exc
        self.answer_headers, self.answer_bytes = response.headers, response.content
        return response.status_code, parse(response)

    async def aclose(self) -> None:
        await self.client.aclose()
