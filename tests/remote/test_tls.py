"""A push module over HTTPS: its certificate is checked against the certificate authorities
the system trusts, or the ones `SSL_CERT_FILE` names (docs/configuration.md). A module
behind a private CA is reached once the engine is told of the CA, and refused before a
byte of the request is sent while it is not."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
from pathlib import Path

import pytest

from roadie import protocol
from roadie.errors import AnswerLost, RetryableError
from roadie.remote.client import PushTransport, RemoteSettings

SECRET = "tls-secret"


def _self_signed(where: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that no system trusts: its own CA."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("openssl (Debian's openssl package) is needed to make a test certificate")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


async def _call_once(url: str) -> Exception:
    transport = PushTransport(RemoteSettings(name="world", transport="push", url=url, secret=SECRET))
    try:
        await transport.request("GET", protocol.MANIFEST, None, key="")
    except Exception as exc:
        return exc
    finally:
        await transport.close()
    raise AssertionError("an unsigned answer was taken")


def test_a_module_behind_a_private_ca_is_reached_once_its_ca_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = _self_signed(tmp_path)
    requests: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()

    async def body() -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=context)
        url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        async with server:
            monkeypatch.delenv("SSL_CERT_FILE", raising=False)
            monkeypatch.delenv("SSL_CERT_DIR", raising=False)
            refused = await _call_once(url)
            assert isinstance(refused, RetryableError), refused
            assert "cannot connect" in refused.message
            assert requests == []  # refused in the handshake: the request never went out

            monkeypatch.setenv("SSL_CERT_FILE", str(cert))
            reached = await _call_once(url)
            # The server is reached; its answer is not signed, so it is not believed.
            assert isinstance(reached, AnswerLost), reached
            assert len(requests) == 1
            assert requests[0].startswith(b"GET " + protocol.MANIFEST.encode())

    asyncio.run(body())
