"""`roadie sandbox serve` in a process of its own, over loopback: signed requests only, a
dropped answer is a broken connection (not a status), and a restart on the same files
answers the stored answer; `roadie sandbox show --url` reads the served world."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from roadie import protocol
from tests.plugin.helpers import SECRET, dispatch_body

ROADIE = str(Path(sys.executable).parent / "roadie")


@contextmanager
def serving(home: Path, *flags: str) -> Iterator[str]:
    """A `roadie sandbox serve --port 0` on `home`'s files; yields its URL once it says so."""
    command = [ROADIE, "sandbox", "serve", "--port", "0", "--db", str(home / "world.db"), *flags]
    env = {**os.environ, "ROADIE_SANDBOX_SECRET": SECRET}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    try:
        deadline = time.monotonic() + 30
        line = b""
        while not line.endswith(b"\n") and time.monotonic() < deadline and proc.poll() is None:
            ready, _, _ = select.select([proc.stdout], [], [], 0.5)
            if ready:
                line += os.read(proc.stdout.fileno(), 1)
        assert line.startswith(b"sandbox serving on "), (line, proc.stderr.read() if proc.poll() is not None else b"")
        yield line.decode().split()[-1]
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()
        if proc.stderr is not None:
            proc.stderr.close()


def _post(url: str, path: str, body: object) -> httpx.Response:
    raw = json.dumps(body).encode()
    return httpx.post(url + path, content=raw, headers=protocol.sign(SECRET, "POST", path, raw), timeout=10)


def test_sandbox_serve_over_loopback(tmp_path: Path) -> None:
    """A served sandbox answers a signed manifest and refuses an unsigned one; with
    --lose-answers 1 the dispatch is carried out but the client sees a transport error;
    restarted with --fail-first 1, it answers 503 once, then the stored answer."""
    with serving(tmp_path, "--lose-answers", "1", "--seed", "3") as url:
        manifest = httpx.get(url + protocol.MANIFEST, headers=protocol.sign(SECRET, "GET", protocol.MANIFEST, b""))
        assert manifest.status_code == 200
        assert protocol.Manifest.model_validate(manifest.json()).module == "sandbox"
        assert httpx.get(url + protocol.MANIFEST).status_code == 401
        with pytest.raises(httpx.TransportError):
            _post(url, protocol.DISPATCH, dispatch_body("k1"))
        shown = subprocess.run(
            [ROADIE, "sandbox", "show", "--url", url, "--secret", SECRET, "--json"],
            capture_output=True,
            check=True,
            timeout=30,
        )
        creatures = json.loads(shown.stdout)["creatures"]
        assert len(creatures) == 2
    assert (tmp_path / "world-keys.db").exists()  # the default ledger, next to --db

    with serving(tmp_path, "--fail-first", "1") as url:
        assert _post(url, protocol.DISPATCH, dispatch_body("k1")).status_code == 503
        answer = _post(url, protocol.DISPATCH, dispatch_body("k1"))
        assert answer.status_code == 200
        assert sorted(r["ref"] for r in answer.json()["resources"]) == sorted(creatures)
