"""Push, both ends: the SDK's server refuses replayed, re-targeted and oversized requests
and signs every answer for its request; the engine carries out nothing an answer says
unless the module signed it for that very request."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from roadie import protocol
from roadie.errors import AnswerLost, ConfigError, PermanentError
from roadie.remote.client import PushTransport, RemoteSettings, judge, module_secret
from tests.plugin.helpers import SECRET, Served, dispatch_body, revert_body


def test_the_sdk_server_refuses_replayed_re_targeted_and_oversized_requests(tmp_path: Path) -> None:
    async def body() -> None:
        async with Served(tmp_path) as s:
            content = json.dumps(dispatch_body("k1")).encode()
            captured = protocol.sign(SECRET, "POST", protocol.DISPATCH, content)
            first = await s.http.post(protocol.DISPATCH, content=content, headers=captured)
            assert first.status_code == 200, first.text
            replayed = await s.http.post(protocol.DISPATCH, content=content, headers=captured)
            assert replayed.status_code == 401
            assert "replayed" in replayed.json()["error"]["message"]

            # A revert signed for /revert, sent to /dispatch: refused, nothing acts.
            revert = json.dumps(revert_body("k2")).encode()
            moved = await s.http.post(
                protocol.DISPATCH, content=revert, headers=protocol.sign(SECRET, "POST", protocol.REVERT, revert)
            )
            assert moved.status_code == 401
            assert "wrong signature" in moved.json()["error"]["message"]

            huge = b'{"pad": "' + b"x" * protocol.MAX_BODY_BYTES + b'"}'
            over = await s.http.post(
                protocol.DISPATCH, content=huge, headers=protocol.sign(SECRET, "POST", protocol.DISPATCH, huge)
            )
            assert over.status_code == 413
            assert [e["key"] for e in s.world.effects() if e["op"] == "create"] == ["k1", "k1"]

        # The ids it accepted are in its key ledger: a restarted server refuses them too.
        async with Served(tmp_path) as again:
            replayed = await again.http.post(protocol.DISPATCH, content=content, headers=captured)
            assert replayed.status_code == 401
            assert "replayed" in replayed.json()["error"]["message"]

    asyncio.run(body())


def test_the_sdk_server_signs_every_answer_under_its_request_id(tmp_path: Path) -> None:
    async def body() -> None:
        async with Served(tmp_path) as s:
            for path, payload in (
                (protocol.DISPATCH, dispatch_body("k1")),
                (protocol.DISPATCH, dispatch_body("k2", count=0)),  # a 422 is signed too
            ):
                content = json.dumps(payload).encode()
                headers = protocol.sign(SECRET, "POST", path, content)
                answer = await s.http.post(path, content=content, headers=headers)
                protocol.verify_answer(SECRET, headers[protocol.H_ID], path, answer.headers, answer.content)
                with pytest.raises(protocol.SignatureRefused, match="another request"):
                    protocol.verify_answer(SECRET, protocol.new_id(), path, answer.headers, answer.content)
            unsigned = await s.http.post(protocol.DISPATCH, content=b"{}")
            assert unsigned.status_code == 401
            assert protocol.H_SIGNATURE not in unsigned.headers  # no id to sign it under

    asyncio.run(body())


def _transport(handler: object, secret: protocol.Secrets = SECRET) -> PushTransport:
    settings = RemoteSettings(name="world", transport="push", url="http://world", secret=secret)
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://world")  # type: ignore[arg-type]
    return PushTransport(settings, client=http)


ANSWER = json.dumps({"resources": [{"kind": "creature", "ref": "0x1"}]}).encode()


@pytest.mark.parametrize(
    ("forge", "expected"),
    [
        ("unsigned", "unsigned answer"),
        ("another secret", "wrong signature"),
        ("another request", "another request"),
    ],
)
def test_the_engine_believes_no_answer_not_signed_for_its_request(forge: str, expected: str) -> None:
    """Someone between the engine and the module answers in its place, or replays an
    answer to an earlier request: an answer lost, asked again under the same key."""

    def handler(request: httpx.Request) -> httpx.Response:
        request_id = request.headers[protocol.H_ID]
        if forge == "another request":
            request_id = protocol.new_id()
        secret = "not the secret" if forge == "another secret" else SECRET
        headers = {} if forge == "unsigned" else protocol.sign_answer(secret, request_id, protocol.DISPATCH, ANSWER)
        return httpx.Response(200, content=ANSWER, headers=headers)

    async def body() -> None:
        transport = _transport(handler)
        with pytest.raises(AnswerLost, match=expected):
            await transport.call("dispatch", dispatch_body("k1"), "k1")
        await transport.close()

    asyncio.run(body())


def test_the_engine_takes_a_signed_answer_from_a_module_rotating_its_secret() -> None:
    new = protocol.new_secret()

    def handler(request: httpx.Request) -> httpx.Response:
        assert len(request.headers[protocol.H_SIGNATURE].split()) == 2  # one per secret
        signed = protocol.sign_answer(new, request.headers[protocol.H_ID], protocol.DISPATCH, ANSWER)
        return httpx.Response(200, content=ANSWER, headers=signed)

    async def body() -> None:
        transport = _transport(handler, secret=[new, SECRET])
        status, answer = await transport.call("dispatch", dispatch_body("k1"), "k1")
        assert (status, answer) == (200, json.loads(ANSWER))
        await transport.close()

    asyncio.run(body())


def test_the_engine_reads_no_oversized_answer_and_no_answer_over_the_resource_cap() -> None:
    huge = b'{"resources": [], "pad": "' + b"x" * protocol.MAX_BODY_BYTES + b'"}'

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=huge)

    async def body() -> None:
        transport = _transport(handler)
        with pytest.raises(AnswerLost, match="over"):
            await transport.call("dispatch", dispatch_body("k1"), "k1")
        await transport.close()

    asyncio.run(body())
    many = {"resources": [{"kind": "creature", "ref": str(n)} for n in range(protocol.MAX_RESOURCES + 1)]}
    with pytest.raises(PermanentError, match="over the limit"):
        judge("world", "dispatch", 200, many)


def test_a_module_refusing_our_signature_is_a_permanent_failure_naming_the_secrets() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        refusal = json.dumps(protocol.error_body("wrong signature")).encode()
        request_id = request.headers[protocol.H_ID]
        signed = protocol.sign_answer("the module's other secret", request_id, protocol.DISPATCH, refusal)
        return httpx.Response(401, content=refusal, headers=signed)

    async def body() -> None:
        transport = _transport(handler)
        with pytest.raises(PermanentError, match="same secret"):
            await transport.call("dispatch", dispatch_body("k1"), "k1")
        await transport.close()

    asyncio.run(body())


def test_several_secrets_come_as_a_list_or_as_whsec_secrets_in_one_string() -> None:
    new, old = protocol.new_secret(), protocol.new_secret()
    assert protocol.secret_list(f" {new}\n {old} ") == [new, old]
    assert protocol.secret_list([new, "a pass phrase"]) == [new, "a pass phrase"]
    # Split, a pass phrase would be several weak secrets, any of them accepted: it is one.
    assert protocol.secret_list("correct horse battery staple") == ["correct horse battery staple"]
    with pytest.raises(ValueError, match="no secret"):
        protocol.secret_list("  ")
    # A whsec_ secret among other words could be either: it is refused, in either order.
    for mixed in (f"{new} plain", f"plain {new}"):
        with pytest.raises(ValueError, match="whsec_ secret among other words"):
            protocol.secret_list(mixed)
    with pytest.raises(ConfigError, match="module 'world': its secret is not usable: a whsec_ secret among"):
        module_secret("world", {"secret": f"a phrase {new}"})
    with pytest.raises(ValueError, match="base64"):
        protocol.secret_bytes("whsec_not base64!")
    assert module_secret("world", {"secret": [new, old]}) == [new, old]
    with pytest.raises(ConfigError, match="module 'world': its secret is not usable"):
        module_secret("world", {"secret": f"{new} whsec_%%%"})
