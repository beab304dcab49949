"""The website says when its database is gone, and comes back by itself when it can: a
SQLite file deleted under `roadie serve`, and a PostgreSQL server that stops answering
(cut off behind a proxy of the test's). Writes are refused at once with 503 and one line,
/healthz answers JSON with the database's state and a non-2xx status, an open live
stream says `outage`, and the log says so once per change, never with a traceback."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.databases import Database, check_reachable
from tests.luanti.harness import wait_for
from tests.remote.servers import free_port

EVENT = "id: hello\ntitle: Hello\nphases:\n  - name: one\n    steps:\n      - {action: core.log, with: {message: hi}}\n"


class CutProxy:
    """A TCP relay to `target` that can be cut (its port refuses connections and those open
    are dropped, as a stopped server's would be) and joined again on the same port."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._open: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self._lock = threading.Lock()
        self.join()

    def join(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            opened, self._open = self._open, []
        if listener is not None:
            # shutdown first: close alone leaves the socket listening while a thread is
            # blocked in accept() on it.
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for sock in opened:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


class Served:
    def __init__(self, home: Path, url: str) -> None:
        self.home = home
        self.env = {**os.environ, "ROADIE_DATABASE_URL": url}
        self.env.pop("ROADIE_CONFIG", None)
        (home / "roadie.toml").write_text("[engine]\npoll_interval = 0.1\n")
        cli = [sys.executable, "-m", "roadie.cli.main"]
        made = subprocess.run(
            [*cli, "token", "create", "--role", "admin", "--name", "staff"],
            cwd=home, env=self.env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        self.headers = {"Authorization": f"Bearer {made.stdout.strip()}"}
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = home / "serve.log"
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [*cli, "serve", "--port", str(self.port)], cwd=home, env=self.env, stdout=out, stderr=subprocess.STDOUT
            )
        wait_for("roadie serve", self._up, 60, every=0.1)
        stored = self.post("/api/v1/events", content=EVENT.encode(), headers={"content-type": "text/plain"})
        assert stored.status_code in (200, 201), stored.text

    def _up(self) -> bool:
        try:
            return httpx.get(f"{self.base}/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.get(self.base + path, headers={**self.headers, **kw.pop("headers", {})}, timeout=30, **kw)

    def post(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.post(self.base + path, headers={**self.headers, **kw.pop("headers", {})}, timeout=30, **kw)

    def start_run(self) -> httpx.Response:
        return self.post("/api/v1/runs", json={"event": "hello", "params": {}})

    def said(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


def _stream_says_outage(served: Served, seconds: float) -> dict[str, Any]:
    """Open the pages' shared stream and read it until it says `outage`."""
    with httpx.stream("GET", f"{served.base}/live/streams?s=runs", headers=served.headers, timeout=seconds) as stream:
        lines = stream.iter_lines()
        assert next(lines) == ": streaming"
        ready.set()
        for line in lines:
            if line == "event: outage":
                said: dict[str, Any] = json.loads(next(lines).removeprefix("data: "))
                return said
    raise AssertionError("the stream ended without saying outage")


ready = threading.Event()


def _healthz(served: Served) -> httpx.Response:
    return httpx.get(f"{served.base}/healthz", timeout=10)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path


@contextlib.contextmanager
def _postgresql_behind_a_proxy(home: Path) -> Iterator[tuple[Served, CutProxy]]:
    """`roadie serve` on a fresh PostgreSQL database reached through a proxy the test can
    cut: its server then refuses connections, as a stopped one would."""
    from sqlalchemy.engine import make_url

    problem = check_reachable("postgresql")
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(problem)
        pytest.skip(problem)
    database = Database("postgresql")
    real = make_url(database.fresh(home))
    proxy = CutProxy((real.host or "127.0.0.1", real.port or 5432))
    try:
        served = Served(home, real.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False))
        try:
            yield served, proxy
        finally:
            served.stop()
    finally:
        proxy.cut()
        database.drop_all()


def test_a_sqlite_file_deleted_under_the_site_stops_its_writes_and_says_so(home: Path) -> None:
    served = Served(home, f"sqlite:///{home / 'roadie.db'}")
    try:
        assert served.start_run().status_code == 201
        heard: list[dict[str, Any]] = []
        ready.clear()
        listener = threading.Thread(target=lambda: heard.append(_stream_says_outage(served, 60)), daemon=True)
        listener.start()
        assert ready.wait(30)
        for name in ("roadie.db", "roadie.db-wal", "roadie.db-shm"):
            (home / name).unlink(missing_ok=True)

        listener.join(30)
        assert heard, "the open stream never said outage"
        assert "The database is gone" in heard[0]["message"]
        health = _healthz(served)
        assert health.status_code == 503
        assert health.headers["content-type"].startswith("application/json")
        assert health.json()["database"]["state"] == "lost"
        refused = served.start_run()
        assert refused.status_code == 503  # before: 201, and the run was lost
        assert "The database is gone" in refused.json()["error"]
        page = served.get("/", headers={"accept": "text/html"})
        assert page.status_code == 503
        assert "The database is gone" in page.text
        assert 'src="/static/outage.js"' in page.text
    finally:
        served.stop()
    log = served.said()
    assert "Traceback" not in log, log[-3000:]
    assert log.count("database unavailable") == 1, log[-3000:]


def test_a_database_server_that_stops_answering_is_said_and_the_site_comes_back_by_itself(home: Path) -> None:
    with _postgresql_behind_a_proxy(home) as (served, proxy):
        assert served.start_run().status_code == 201
        proxy.cut()
        wait_for("/healthz to say the database is unreachable", lambda: _healthz(served).status_code == 503, 30)
        health = _healthz(served).json()
        assert (health["status"], health["database"]["state"]) == ("unavailable", "unreachable"), health
        started = time.monotonic()
        refused = served.start_run()
        assert refused.status_code == 503
        # At once: a write that tried the database would wait out its reconnects (about
        # 6 to 11 s, roadie.store.connector) or the pool's 30 s.
        assert time.monotonic() - started < 5
        assert "does not answer" in refused.json()["error"]

        proxy.join()
        wait_for("/healthz to say the database is back", lambda: _healthz(served).status_code == 200, 60)
        assert served.start_run().status_code == 201
    log = served.said()
    assert "Traceback" not in log, log[-3000:]
    assert log.count("database unavailable") == 1, log[-3000:]
    assert log.count("database back") == 1, log[-3000:]


def test_an_open_live_page_shows_the_outage_within_seconds_and_recovers_without_a_reload(home: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    from tests.web.test_browser import CHROMIUM

    if not os.access(CHROMIUM, os.X_OK):
        message = f"{CHROMIUM} is missing: apt-get install -y chromium (make test does)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    with _postgresql_behind_a_proxy(home) as (served, proxy), sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 390, "height": 844})
            page.goto(f"{served.base}/login")
            page.fill("#token", served.headers["Authorization"].removeprefix("Bearer "))
            page.click("button[type=submit]")
            expect(page.locator("h1")).to_have_text("Runs")
            page.wait_for_selector("html[data-stream-state=open]")  # the page's stream is open
            proxy.cut()
            expect(page.locator("#outage")).to_contain_text("does not answer", timeout=15_000)
            assert page.locator("#outage").get_attribute("role") == "alert"
            proxy.join()
            expect(page.locator("#outage")).to_have_count(0, timeout=30_000)
            assert served.start_run().status_code == 201
            expect(page.locator("#runs")).to_contain_text("hello", timeout=15_000)  # live again
        finally:
            browser.close()
    assert "Traceback" not in served.said()
