"""Request bodies are bounded before any route or its authentication reads them (413).

The refusals are checked against a real `roadie serve` process, whose memory is read from
/proc while a body far over the limit streams at it; what a body under the limit does is
checked in the app itself, on each backend.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.web.conftest import QUICK, Site

MiB = 1 << 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int, str]]:
    """A `roadie serve --no-worker` process on SQLite: its URL, its pid and an admin token."""
    home = tmp_path_factory.mktemp("serve")
    (home / "roadie.toml").write_text('[modules.sandbox]\ndb = "sandbox.db"\n')
    env = {**os.environ, "ROADIE_DATABASE_URL": f"sqlite:///{home / 'roadie.db'}"}
    env.pop("ROADIE_CONFIG", None)
    roadie = [sys.executable, "-m", "roadie.cli.main"]
    made = subprocess.run(
        [*roadie, "token", "create", "--role", "admin", "--name", "staff"],
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    port = _free_port()
    process = subprocess.Popen(
        [*roadie, "serve", "--no-worker", "--port", str(port)], cwd=home, env=env, stderr=subprocess.PIPE, text=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            raise AssertionError("roadie serve did not come up")
        yield base, process.pid, made.stdout.strip()
    finally:
        process.terminate()
        process.wait(timeout=30)
        assert process.stderr is not None
        process.stderr.close()


def _stream_and_watch(pid: int, send: httpx.Client, url: str, mib: int, **kw: object) -> tuple[httpx.Response, float]:
    """POST `mib` MiB made as they are sent (chunked, no Content-Length), sampling the
    server's RSS meanwhile: its answer, and how far its RSS rose above where it began."""
    start = _rss_mib(pid)
    peak = [start]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_mib(pid))
            time.sleep(0.01)

    def body() -> Iterator[bytes]:
        chunk = b"x" * (64 * 1024)
        for _ in range(mib * 16):
            yield chunk

    watcher = threading.Thread(target=sample)
    watcher.start()
    try:
        answer = send.post(url, content=body(), timeout=60, **kw)  # type: ignore[arg-type]
    finally:
        done.set()
        watcher.join()
    return answer, peak[0] - start


def test_a_chunked_body_far_over_the_limit_is_refused_before_authentication_unheld(
    served: tuple[str, int, str],
) -> None:
    """400 MiB streamed at `POST /api/v1/runs` with no token, and 64 MiB at `/login`, are
    refused with 413 naming the limit, and the server's memory grows by no more than a
    few MiB meanwhile (it grew by 800 MB before the bound). An admin's event upload is
    refused past its own, larger limit, with the same small footprint."""
    base, pid, token = served
    with httpx.Client() as client:
        answer, grew = _stream_and_watch(
            pid, client, f"{base}/api/v1/runs", 400, headers={"content-type": "application/json"}
        )
        assert answer.status_code == 413, answer.text
        assert answer.json() == {"error": "the request body is larger than 1 MiB", "field": None}
        assert grew < 16, f"the server grew by {grew:.0f} MiB"

        form = {"content-type": "application/x-www-form-urlencoded"}
        answer, grew = _stream_and_watch(pid, client, f"{base}/login", 64, headers=form)
        assert (answer.status_code, grew < 16) == (413, True), (answer.text, grew)

        admin = {"authorization": f"Bearer {token}", "content-type": "text/plain"}
        answer, grew = _stream_and_watch(pid, client, f"{base}/api/v1/events", 64, headers=admin)
        assert answer.status_code == 413, answer.text
        assert answer.json()["error"] == "the request body is larger than 4 MiB"
        assert grew < 16, f"the server grew by {grew:.0f} MiB"

        # And it still serves.
        assert client.get(f"{base}/healthz").status_code == 200


def test_a_declared_length_over_the_limit_is_refused_at_once(served: tuple[str, int, str]) -> None:
    """A request that declares a body over the limit is answered 413 before it sends a
    byte of it; a browser's gets a page, not JSON."""
    base, _, _ = served
    port = int(base.rsplit(":", 1)[1])
    for path, accept, kind in (("/api/v1/runs", "*/*", b"application/json"), ("/login", "text/html", b"text/html")):
        # A server that waited for the body would never answer: the socket's timeout ends it.
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            head = (
                f"POST {path} HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {10**12}\r\nConnection: close\r\n\r\n"
            )
            sock.sendall(head.encode())
            answer = b""
            while chunk := sock.recv(65536):  # until the server closes: the whole answer
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
        assert kind in answer.lower()
        assert b"larger than 1 MiB" in answer


def test_bodies_under_the_limits_still_work(site: Site) -> None:
    """An event file, a run, a form: under their limits, as before. A file between the
    file's own limit (1 MiB) and the route's (4 MiB) is still the file's mistake (422)."""
    assert site.upload(QUICK).status_code == 201
    started = site.post("/api/v1/runs", "operator", json={"event": "quick-raid", "params": {"count": 3}})
    assert started.status_code == 201, started.text
    big = QUICK + "#" * (2 * MiB) + "\n"
    refused = site.upload(big)
    assert refused.status_code == 422
    assert refused.json()["error"] == "event.yaml: the file is larger than 1 MiB"
    # A body just under the general limit reaches the route (and its validation).
    padded = {"event": "quick-raid", "params": {"pad": "x" * (MiB - 100)}}
    assert site.post("/api/v1/runs", "operator", json=padded).status_code == 422
    over = {"event": "quick-raid", "params": {"pad": "x" * MiB}}
    assert site.post("/api/v1/runs", "operator", json=over).status_code == 413
