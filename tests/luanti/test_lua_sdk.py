"""The Lua SDK's own tests (integrations/luanti/tests/*.lua) under plain Lua 5.1 and LuaJIT:
SHA-256 and HMAC against FIPS 180-4 and RFC 4231; base64 against RFC 4648; Standard Webhooks
signing against both worked examples of docs/protocol.md, with one secret or several, and
poll answers refused when unsigned, wrongly signed, stale or signed for another request;
JSON that keeps [] from {}, null from absent, and large integers; the key ledger, its fence
marks kept across a restart; a module answering the protocol's calls, a stale fence refused
with 412 and nothing done; and the poll loop against a gateway made of functions."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.luanti.harness import REPO

SCRIPTS = sorted((REPO / "integrations" / "luanti" / "tests").glob("test_*.lua"))


@pytest.mark.parametrize("interpreter", ["lua5.1", "luajit"])
@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_the_lua_sdk(interpreter: str, script: os.PathLike[str]) -> None:
    found = shutil.which(interpreter)
    if found is None:
        message = f"{interpreter} is missing: apt-get install -y {interpreter} (make test does)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    done = subprocess.run([found, str(script)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith("ok:"), done.stdout
