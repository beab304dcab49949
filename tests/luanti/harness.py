"""A real Luanti server for tests: a fresh world of Minetest Game with the Roadie mod
copied in as an operator would (one folder and a few settings) and a probe mod that
answers what the world holds; and `roadie gateway` with a worker's CLI beside it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from roadie import protocol
from tests.remote.servers import free_port

REPO = Path(__file__).resolve().parents[2]
MOD = REPO / "integrations" / "luanti" / "roadie"
PROBE = Path(__file__).resolve().parent / "probe"
# Debian's /usr/games/minetestserver is a script that adds its own --config and --logfile.
SERVER = "/usr/lib/minetest/minetestserver"
GAME = "minetest"  # Minetest Game, from minetest-data
SECRET = "luanti-acceptance-secret"


def require_luanti() -> None:
    """A Luanti server, or a skip (a loud failure in CI: `make test` installs it)."""
    if not os.access(SERVER, os.X_OK):
        message = f"{SERVER} is missing: apt-get install -y minetest-server (make test does)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60.0, every: float = 0.1) -> Any:
    """Poll `check` until it gives something truthy; fail saying `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


class Luanti:
    """One headless server on a world of its own, which a test may kill -9 and start again."""

    def __init__(self, home: Path, gateway_url: str, *, secret: str = SECRET, extra: str = "") -> None:
        self.home = home
        self.world = home / "world"
        self.config = home / "minetest.conf"
        self.log = home / "debug.txt"
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        mods = self.world / "worldmods"
        mods.mkdir(parents=True, exist_ok=True)
        shutil.copytree(MOD, mods / "roadie")  # installed as the docs say: one folder
        shutil.copytree(PROBE, mods / "roadie_probe")
        (self.world / "world.mt").write_text(f"gameid = {GAME}\nbackend = sqlite3\n")
        (self.world / "roadie_secret.txt").write_text(secret + "\n")
        self.config.write_text(
            "\n".join(
                [
                    "secure.http_mods = roadie",
                    f"roadie.gateway_url = {gateway_url}",
                    "roadie.secret_file = roadie_secret.txt",
                    "roadie.module = luanti",
                    "roadie.wait = 5",
                    "mg_name = singlenode",
                    "time_speed = 0",
                    "motd = Welcome to the arena",
                    "enable_damage = false",
                    "enable_rollback_recording = false",
                    "server_announce = false",
                    extra,
                ]
            )
            + "\n"
        )

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                SERVER,
                "--world", str(self.world), "--gameid", GAME, "--config", str(self.config),
                "--port", str(self.port), "--logfile", str(self.log),
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.home,
            env={**os.environ, "HOME": str(self.home)},
        )  # fmt: skip

    def ready(self, timeout: float = 90.0) -> dict[str, Any]:
        """Wait until the world answers the probe and the mod has polled the gateway."""
        return wait_for(
            "the Luanti server to start and its mod to poll the gateway",
            lambda: (seen := self.look(timeout=1.0, quiet=True)) is not None and seen["polls"] > 0 and seen,
            timeout,
        )

    def look(self, timeout: float = 30.0, *, quiet: bool = False) -> dict[str, Any] | None:
        """What the world holds now, as the probe mod sees it from inside."""
        self._alive()
        probe = self.world / "probe"
        if not probe.is_dir():
            return None
        ask = uuid.uuid4().hex
        (probe / f"request-{ask}.json").write_text("{}")
        answer = probe / f"answer-{ask}.json"
        try:
            wait_for("the probe's answer", answer.exists, timeout, every=0.05)
        except AssertionError:
            if quiet:
                return None
            raise
        seen: dict[str, Any] = json.loads(answer.read_text())
        answer.unlink()
        for listed in ("tagged", "creatures", "chest"):  # Luanti's JSON writes an empty list as null
            seen[listed] = seen.get(listed) or []
        return seen

    def _alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"the Luanti server exited ({self.process.returncode}):\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        if not self.log.exists():
            return "(no log)"
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL: what the world did since its last save is lost."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)
        self.process = None

    def stop(self) -> None:
        """A clean shutdown, which saves the map."""
        if self.process is None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(30)
        self.process = None


class Roadie:
    """The engine's side: a project folder, `roadie gateway`, and its CLI."""

    def __init__(self, home: Path, *, secret: str = SECRET) -> None:
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "ROADIE_SECRET_LUANTI": secret}
        self.env.pop("ROADIE_CONFIG", None)
        self.env.pop("ROADIE_DATABASE_URL", None)
        (home / "roadie.toml").write_text(
            f'database_url = "sqlite:///{home / "roadie.db"}"\n\n'
            "[engine]\npoll_interval = 0.05\n\n"
            '[modules.luanti]\ntransport = "pull"\n'
        )
        self.gateway: subprocess.Popen[bytes] | None = None
        self.gateway_log = home / "gateway.log"

    def start_gateway(self) -> None:
        with self.gateway_log.open("ab") as out:
            self.gateway = subprocess.Popen(
                [*self.cli(), "--log-level", "info", "gateway", "--port", str(self.port), "--visibility", "5"],
                cwd=self.home, env=self.env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

        def listening() -> bool:
            try:
                return httpx.post(self.url + protocol.PULL, content=b"{}", timeout=1).status_code == 401
            except httpx.TransportError:
                return False

        # Its start (imports, the store's migrations) took 42 s on a machine shared at a load
        # of 20 on 2 cores; a gateway that never listens is stopped, not left to a later test.
        try:
            wait_for("roadie gateway to listen", listening, 120)
        except AssertionError:
            self.stop_gateway()
            raise

    def stop_gateway(self) -> None:
        """SIGTERM, as systemd stops it; one that has not stopped within a minute is killed
        (so the next test does not inherit it) and the test fails, with its log."""
        gateway, self.gateway = self.gateway, None
        if gateway is None:
            return
        gateway.terminate()
        try:
            gateway.wait(60)
        except subprocess.TimeoutExpired:
            gateway.kill()
            gateway.wait()
            said = self.gateway_log.read_text(errors="replace")[-3000:]
            raise AssertionError(f"the gateway did not stop within 60 s of SIGTERM:\n{said}") from None

    @staticmethod
    def cli() -> list[str]:
        return [sys.executable, "-m", "roadie.cli.main"]

    def run(self, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [*self.cli(), *args], cwd=self.home, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        return done

    def json(self, *args: str, timeout: float = 300.0, exit_code: int = 0) -> Any:
        done = self.run(*args, "--json", timeout=timeout)
        assert done.returncode == exit_code, (
            f"roadie {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
        return json.loads(done.stdout)
