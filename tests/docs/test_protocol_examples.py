"""docs/protocol.md is true: every example body is what `roadie.protocol` accepts,
the worked signature is what `protocol.signature` computes, and every request example,
sent signed to the SDK serving the sandbox (or to the engine's gateway), gets the answer
the page shows."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, ConfigDict

from roadie import protocol
from roadie.conformance.session import resource_problem
from roadie.modules.sandbox import module as sandbox
from roadie.plugin.server import ModuleServer
from roadie.registry import Registry
from roadie.remote.gateway import Gateway
from roadie.remote.queue import WorkQueue
from roadie.store.store import Store

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
SECRET = "example-secret"

MODULE_PATHS = {"dispatch", "revert", "inspect", "tagged", "lease/read", "lease/apply", "lease/restore"}
ENGINE_PATHS = {"announce", "pull", "answer", "report"}

REQUESTS: dict[str, type[BaseModel]] = {
    "dispatch": protocol.DispatchRequest,
    "revert": protocol.RevertRequest,
    "inspect": protocol.InspectRequest,
    "tagged": protocol.TaggedRequest,
    "lease/read": protocol.LeaseRequest,
    "lease/apply": protocol.LeaseRequest,
    "lease/restore": protocol.LeaseRequest,
    "announce": protocol.Manifest,
    "pull": protocol.PullRequest,
    "answer": protocol.AnswerPost,
    "report": protocol.ReportRequest,
}


class DispatchAnswer(BaseModel):
    resources: list[protocol.WireResource]
    output: Any = None


class Empty(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Announced(Empty):
    announced: str


class Accepted(Empty):
    accepted: bool
    reason: str | None = None  # why an answer was not kept


ANSWERS: dict[str, type[BaseModel]] = {
    "manifest": protocol.Manifest,
    "dispatch": DispatchAnswer,
    "revert": protocol.RevertAnswer,
    "inspect": protocol.InspectAnswer,
    "tagged": protocol.TaggedAnswer,
    "lease/read": protocol.LeaseValue,
    "lease/apply": Empty,
    "lease/restore": Empty,
    "announce": Announced,
    "pull": protocol.PullAnswer,
    "answer": Accepted,
    "report": protocol.ReportAnswer,
}


@dataclass(frozen=True)
class Example:
    role: str  # request, answer, signing
    name: str
    status: int
    shape_only: bool
    text: str
    line: int

    @property
    def body(self) -> Any:
        return json.loads(self.text)

    def __repr__(self) -> str:
        return f"<{self.role} {self.name} {self.status} at protocol.md:{self.line}>"


_FENCE = re.compile(r"^```(\S*)(.*)$")


def examples() -> list[Example]:
    """The fenced blocks whose info string names them: `json request NAME`, `json answer
    NAME [STATUS] [shape]`, `text signing`."""
    found: list[Example] = []
    lines = DOC.read_text().splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        start = i
        i += 1
        body: list[str] = []
        while not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1
        words = match.group(2).split()
        if match.group(1) == "json" and words and words[0] in ("request", "answer"):
            status = next((int(w) for w in words[2:] if w.isdigit()), 200)
            found.append(Example(words[0], words[1], status, "shape" in words[2:], "\n".join(body), start + 1))
        elif match.group(1) == "text" and words == ["signing"]:
            found.append(Example("signing", "signing", 0, False, "\n".join(body), start + 1))
    return found


EXAMPLES = examples()


def answers_after(request: Example) -> list[Example]:
    """The answer examples that follow `request`, up to the next request."""
    at = EXAMPLES.index(request)
    following: list[Example] = []
    for example in EXAMPLES[at + 1 :]:
        if example.role == "request":
            break
        if example.role == "answer":
            following.append(example)
    return following


def test_the_page_has_an_example_for_every_path() -> None:
    requests = {e.name for e in EXAMPLES if e.role == "request"}
    answers = {e.name for e in EXAMPLES if e.role == "answer"}
    assert requests == MODULE_PATHS | ENGINE_PATHS
    assert answers == MODULE_PATHS | ENGINE_PATHS | {"manifest", "error"}
    assert all(answers_after(e) for e in EXAMPLES if e.role == "request")


@pytest.mark.parametrize("example", [e for e in EXAMPLES if e.role != "signing"], ids=repr)
def test_each_example_body_is_what_the_protocol_accepts(example: Example) -> None:
    body = example.body
    if example.role == "request":
        REQUESTS[example.name].model_validate(body)
    elif example.status >= 400 or example.name == "error":
        protocol.ErrorBody.model_validate(body)
    else:
        ANSWERS[example.name].model_validate(body)
        if example.name == "dispatch":
            assert [resource_problem(r) for r in body["resources"]] == [None] * len(body["resources"])


def test_the_worked_signatures_are_what_protocol_signature_computes() -> None:
    request, answer = [e for e in EXAMPLES if e.role == "signing"]
    computed = []
    for signing in (request, answer):
        fields = dict(line.split(": ", 1) for line in signing.text.splitlines())
        body = fields["body"].encode()
        expected = protocol.signature(
            fields["secret"], fields["id"], fields["timestamp"], fields["method"], fields["path"], body
        )
        assert fields["signature"] == expected
        computed.append((fields, expected))
    (fields, expected), (answered, _) = computed
    # The request signs one of the page's dispatch examples, as sent (compact JSON), and
    # the request shown after it carries that signature; its answer is signed under its id.
    dispatches = [e.body for e in EXAMPLES if e.role == "request" and e.name == "dispatch"]
    assert json.loads(fields["body"]) in dispatches
    shown = DOC.read_text().split("```http")[1].split("```")[0]
    assert f"{protocol.H_SIGNATURE}: {expected}" in shown
    assert f"{protocol.H_TIMESTAMP}: {fields['timestamp']}" in shown
    assert f"{protocol.H_ID}: {fields['id']}" in shown
    assert shown.strip().endswith(fields["body"])
    assert answered["id"] == fields["id"]
    assert answered["method"] == protocol.ANSWER_METHOD
    headers = {protocol.H_ID: answered["id"], protocol.H_TIMESTAMP: answered["timestamp"]}
    headers[protocol.H_SIGNATURE] = answered["signature"]
    protocol.verify_answer(
        answered["secret"], fields["id"], answered["path"], headers, answered["body"].encode(),
        now=float(answered["timestamp"]),
    )  # fmt: skip


def check_answer(request: Example, status: int, got: Any) -> None:
    """The documented answer of the same status: exact for a 2xx (or its shape, when the
    page says so); for an error, the status, the error shape and the field at fault."""
    candidates = answers_after(request)
    matching = [a for a in candidates if a.status == status]
    assert matching, f"{request!r} answered {status} {got}; the page shows {candidates}"
    documented = matching[0]
    if status >= 400:
        protocol.ErrorBody.model_validate(got)
        assert got["error"].get("field") == documented.body["error"].get("field")
    elif documented.shape_only:
        ANSWERS[documented.name].model_validate(got)
    else:
        assert got == documented.body, f"{request!r}"


def test_module_examples_get_the_documented_answers(tmp_path: Path) -> None:
    """In page order, against a fresh sandbox served by the SDK."""

    async def go() -> None:
        server = ModuleServer(
            sandbox,
            secret=SECRET,
            ledger_path=str(tmp_path / "keys.db"),
            settings={"db": "w.db"},
            base_dir=str(tmp_path),
        )
        async with server:
            transport = httpx.ASGITransport(app=server.app())
            async with httpx.AsyncClient(transport=transport, base_url="http://sandbox.test") as client:
                headers = protocol.sign(SECRET, "GET", protocol.MANIFEST, b"")
                response = await client.get(protocol.MANIFEST, headers=headers)
                assert response.status_code == 200
                [manifest_doc] = [e for e in EXAMPLES if e.role == "answer" and e.name == "manifest"]
                real = protocol.Manifest.model_validate(response.json())
                documented = protocol.Manifest.model_validate(manifest_doc.body)
                actions = {a.name: a for a in real.actions}
                for action in documented.actions:
                    assert actions[action.name].reversible == action.reversible
                assert {(lease.name, lease.targeted) for lease in documented.leases} <= {
                    (lease.name, lease.targeted) for lease in real.leases
                }
                assert (real.module, real.inspect, real.tagged) == (
                    documented.module,
                    documented.inspect,
                    documented.tagged,
                )
                sent = 0
                for request in EXAMPLES:
                    if request.role != "request" or request.name not in MODULE_PATHS:
                        continue
                    path = f"{protocol.PREFIX}/{request.name}"
                    raw = request.text.encode()
                    key = request.body.get("idempotency_key", protocol.NO_KEY)  # tagged is about no step
                    signed = protocol.sign(SECRET, "POST", path, raw, key=key)
                    response = await client.post(path, content=raw, headers=signed)
                    check_answer(request, response.status_code, response.json())
                    sent += 1
                assert sent >= len(MODULE_PATHS)

    asyncio.run(go())


def test_gateway_examples_get_the_documented_answers(tmp_path: Path) -> None:
    """announce, pull (a dispatch queued for the module), answer and report, signed by the
    module and sent to the engine's gateway over a fresh store."""

    async def go() -> None:
        store = await Store.open(f"sqlite:///{tmp_path / 'roadie.db'}")
        try:
            queue = WorkQueue(store)
            gateway = Gateway(store, queue, {"sandbox": SECRET}, Registry())
            # The call the page's pull example hands out: its first spawn_orcs dispatch.
            first = next(e for e in EXAMPLES if e.role == "request" and e.name == "dispatch" and "spawn_orcs" in e.text)
            waiting = asyncio.create_task(queue.submit("sandbox", "dispatch", "run7-spawn_orcs", first.body))
            await asyncio.sleep(0.05)
            transport = httpx.ASGITransport(app=gateway.app())
            async with httpx.AsyncClient(transport=transport, base_url="http://engine.test") as client:
                for request in EXAMPLES:
                    if request.role != "request" or request.name not in ENGINE_PATHS:
                        continue
                    path = f"{protocol.PREFIX}/{request.name}"
                    raw = request.text.encode()
                    key = request.body.get("idempotency_key", protocol.NO_KEY)
                    signed = protocol.sign(SECRET, "POST", path, raw, key=key, module="sandbox")
                    response = await client.post(path, content=raw, headers=signed)
                    check_answer(request, response.status_code, response.json())
            status, body = await asyncio.wait_for(waiting, 5)
            answer = next(e for e in EXAMPLES if e.role == "request" and e.name == "answer").body
            assert (status, body) == (answer["status"], answer["body"])
        finally:
            await store.close()

    asyncio.run(go())
