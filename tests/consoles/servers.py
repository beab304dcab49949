"""Real console game servers for tests: OpenArena (ioquake3, rcon over UDP) and Teeworlds
(econ over TCP), each in a folder of its own on free ports of 127.0.0.1, which a test may
kill -9 and start again; a UDP proxy that loses what it is told to; and a Roadie project
folder whose roadie.toml names the shipped definitions.

The tests read the servers back with clients of their own, written here from the
protocols and sharing no code with Roadie's transports, so a fault in those cannot hide
itself. The OpenArena reader sends from 127.0.0.2: ioquake3 rate-limits rcon per address,
and the tests' reads must not spend Roadie's budget.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.luanti.harness import wait_for
from tests.remote.servers import free_port

REPO = Path(__file__).resolve().parents[2]
OPENARENA = "/usr/lib/ioquake3/ioq3ded"
OPENARENA_DATA = "/usr/lib/openarena-server"
TEEWORLDS = "/usr/games/teeworlds-server"
PASSWORD = "console-acceptance-pw"


def require(binary: str, package: str) -> None:
    """A server binary, or a skip (a loud failure in CI: `make test` installs it)."""
    if not os.access(binary, os.X_OK):
        message = f"{binary} is missing: apt-get install -y {package} (make test does)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A game server process in `home`, killed with SIGKILL or stopped at the end."""

    def __init__(self, home: Path) -> None:
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        self.log = home / "server.log"
        self.process: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv(), cwd=self.home, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "HOME": str(self.home)},
            )  # fmt: skip
        self.ready()

    def ready(self) -> None:
        raise NotImplementedError

    def alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"the server exited ({self.process.returncode}):\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL: the server forgets whatever it held only in memory."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)
        self.process = None

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(20)
        self.process = None


class OpenArena(Server):
    """A dedicated ioquake3 server of OpenArena on oa_dm1, LAN only (no master server)."""

    def __init__(self, home: Path) -> None:
        super().__init__(home)
        self.port = free_udp_port()

    def argv(self) -> list[str]:
        return [
            OPENARENA,
            "+set", "com_basegame", "baseoa", "+set", "fs_basepath", OPENARENA_DATA,
            "+set", "fs_homepath", str(self.home), "+set", "com_homepath", ".openarena",
            "+set", "com_legacyprotocol", "71", "+set", "com_protocol", "71",
            "+set", "dedicated", "1", "+set", "net_ip", "127.0.0.1", "+set", "net_port", str(self.port),
            "+set", "net_enabled", "1",  # IPv4 only
            "+set", "sv_master1", "", "+set", "sv_master2", "", "+set", "sv_master3", "",
            "+set", "rconpassword", PASSWORD, "+set", "bot_enable", "1", "+set", "bot_minplayers", "0",
            "+map", "oa_dm1",
        ]  # fmt: skip

    def ready(self) -> None:
        wait_for("OpenArena to answer rcon", lambda: self.alive() or self.rcon("status", timeout=0.5), 60, every=0.2)

    def rcon(self, command: str, *, timeout: float = 2.0) -> str | None:
        """The test's own rcon client, from 127.0.0.2; None when nothing answers."""
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.2", 0))
            s.settimeout(timeout)
            s.sendto(b"\xff\xff\xff\xffrcon " + PASSWORD.encode() + b" " + command.encode(), ("127.0.0.1", self.port))
            parts: list[bytes] = []
            try:
                while True:
                    data, _ = s.recvfrom(65536)
                    parts.append(data.removeprefix(b"\xff\xff\xff\xffprint\n"))
                    s.settimeout(0.3)
            except TimeoutError:
                pass
        return b"".join(parts).decode(errors="replace") if parts else None

    def cvar(self, name: str) -> str:
        reply = wait_for(f"{name} to be read", lambda: self.rcon(name), 30)
        found = re.search(rf'"{name}" is:"(.*?)(\^7)?"', reply)
        assert found, reply
        return found.group(1)

    def bots(self) -> list[str]:
        """The names `status` lists, one per client, in slot order."""
        reply = wait_for("status to be read", lambda: self.rcon("status"), 30)
        names = []
        for line in reply.splitlines():
            row = re.match(r"^\s*\d+\s+-?\d+\s+\d+\s+(.+?)\s*\^7\s*bot\b", line)
            if row:
                names.append(row.group(1).strip())
        return names

    def world(self) -> dict[str, Any]:
        return {
            "gravity": self.cvar("g_gravity"),
            "motd": self.cvar("g_motd"),
            "speed": self.cvar("g_speed"),
            "bots": sorted(self.bots()),
        }


class Teeworlds(Server):
    """A Teeworlds 0.7 server, not registered with any master, econ on 127.0.0.1."""

    def __init__(self, home: Path) -> None:
        super().__init__(home)
        self.port = free_udp_port()
        self.econ_port = free_port()

    def argv(self) -> list[str]:
        settings = [
            f"sv_port {self.port}", "sv_register 0", "sv_bindaddr 127.0.0.1", f"ec_port {self.econ_port}",
            f"ec_password {PASSWORD}", "ec_bindaddr 127.0.0.1", "sv_name roadie-test", "sv_motd welcome",
        ]  # fmt: skip
        return [TEEWORLDS, "; ".join(settings)]

    def start(self) -> None:
        # Teeworlds binds its econ port without SO_REUSEADDR: after a SIGKILL the port is
        # held by the dead server's connections until the kernel lets them go (up to a
        # minute), and a server started before that runs with no econ at all.
        wait_for("the econ port to be free", lambda: bindable(self.econ_port), 120, every=0.5)
        super().start()

    def ready(self) -> None:
        wait_for("Teeworlds' econ to answer", lambda: self.alive() or self.econ(["sv_name"], timeout=0.5), 60, 0.2)

    def econ(self, commands: list[str], *, timeout: float = 3.0) -> list[str] | None:
        """The test's own econ client: the console lines each command printed."""
        try:
            with socket.create_connection(("127.0.0.1", self.econ_port), timeout=timeout) as s:
                reader = s.makefile("rb")

                def line() -> str:
                    return reader.readline().replace(b"\0", b"").decode(errors="replace").strip()

                while "password" not in line().lower():
                    pass
                s.sendall(PASSWORD.encode() + b"\n")
                assert "successful" in line()
                replies = []
                for index, command in enumerate(commands):
                    # Every econ client hears every command's output: keep the lines under
                    # the server's log of this command, run by the client that ran the mark.
                    mark = f"test-mark-{os.getpid()}-{index}"
                    s.sendall(f"{command}\necho {mark}\n".encode())
                    runs: list[tuple[str, str, list[str]]] = []
                    while not ((text := line()).endswith(f"]: {mark}") and runs and runs[-1][1] == f"echo {mark}"):
                        ran = re.search(r"\[server\]: cid=(\d+) cmd='(.*)'$", text)
                        if ran:
                            runs.append((ran.group(1), ran.group(2), []))
                        elif "[Console]: " in text and runs:
                            runs[-1][2].append(text.split("[Console]: ", 1)[1])
                    ours = runs[-1][0]
                    mine = [out for cid, cmd, out in runs if cid == ours and cmd == command]
                    replies.append("\n".join(mine[-1]) if mine else "")
                # Leave as Roadie does, by closing this half and reading to the end:
                # Teeworlds dies of SIGPIPE when a client that hung up whole is sent a line
                # (see TeeworldsEcon.close).
                s.shutdown(socket.SHUT_WR)
                while reader.readline():
                    pass
                return replies
        except (OSError, AssertionError):
            return None

    def setting(self, name: str) -> str:
        reply = wait_for(f"{name} to be read", lambda: self.econ([name]), 30)[0]
        found = re.search(r"^Value: (.*)$", reply, re.MULTILINE)
        assert found, reply
        return found.group(1)


def bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class LossyProxy:
    """A UDP relay between Roadie and a server that drops what it is told to: the replies
    to the next N commands that match a pattern (`lose_reply_to`), the next N such commands
    themselves, as a server that rate-limits does (`lose_request_to`), or everything
    (`cut`). It counts the commands that passed, by their text."""

    def __init__(self, server_port: int) -> None:
        self.server = ("127.0.0.1", server_port)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.lose: list[tuple[re.Pattern[str], int, bool]] = []
        self.cut = False
        self.seen: list[str] = []
        self.lost: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def lose_reply_to(self, pattern: str, times: int = 1) -> None:
        with self._lock:
            self.lose.append((re.compile(pattern), times, False))

    def lose_request_to(self, pattern: str, times: int = 1) -> None:
        with self._lock:
            self.lose.append((re.compile(pattern), times, True))

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                data, client = self.sock.recvfrom(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if self.cut:
                continue
            command = data.decode(errors="replace").split(" ", 2)[-1]
            drop = swallow = False
            with self._lock:
                self.seen.append(command)
                for index, (pattern, times, request) in enumerate(self.lose):
                    if times > 0 and pattern.search(command):
                        self.lose[index] = (pattern, times - 1, request)
                        drop, swallow = True, request
                        self.lost.append(command)
                        break
            if swallow:
                continue
            threading.Thread(target=self._relay, args=(data, client, drop), daemon=True).start()

    def _relay(self, data: bytes, client: tuple[str, int], drop: bool) -> None:
        """Send one request on, from a socket of its own, and relay (or lose) its reply."""
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as upstream:
            upstream.settimeout(3)
            upstream.sendto(data, self.server)
            try:
                while True:
                    reply, _ = upstream.recvfrom(65536)
                    if not drop and not self.cut:
                        self.sock.sendto(reply, client)
                    upstream.settimeout(0.5)
            except (TimeoutError, OSError):
                return

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        self._thread.join(5)


class Project:
    """A Roadie project folder whose roadie.toml names a shipped console definition."""

    def __init__(
        self, home: Path, module: str, definition: str, address: str, *, keep_interval: float | None = None
    ) -> None:
        self.home = home
        self.keep_interval = keep_interval
        home.mkdir(parents=True, exist_ok=True)
        self.module = module
        self.env = {**os.environ, f"ROADIE_CONSOLE_{module.upper()}": PASSWORD}
        self.env.pop("ROADIE_CONFIG", None)
        self.env.pop("ROADIE_DATABASE_URL", None)
        self.write_config(definition, address)
        self.worker: subprocess.Popen[bytes] | None = None
        self.worker_log = home / "worker.log"

    def write_config(self, definition: str, address: str) -> None:
        (self.home / "roadie.toml").write_text(
            f'database_url = "sqlite:///{self.home / "roadie.db"}"\n\n'
            "[engine]\npoll_interval = 0.05\n"
            + ("" if self.keep_interval is None else f"keep_interval = {self.keep_interval}\n")
            + "\n"
            + f'[modules.{self.module}]\nconsole = "{REPO / definition}"\naddress = "{address}"\n'
        )

    @staticmethod
    def cli() -> list[str]:
        return [sys.executable, "-m", "roadie.cli.main"]

    def run(self, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.cli(), *args], cwd=self.home, env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def json(self, *args: str, timeout: float = 300.0, exit_code: int | None = 0) -> Any:
        done = self.run(*args, "--json", timeout=timeout)
        assert exit_code is None or done.returncode == exit_code, (
            f"roadie {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
        return json.loads(done.stdout)

    def start_worker(self) -> None:
        with self.worker_log.open("ab") as out:
            self.worker = subprocess.Popen(
                [*self.cli(), "--log-level", "info", "worker"], cwd=self.home, env=self.env,
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def stop_worker(self) -> None:
        if self.worker is not None:
            self.worker.terminate()
            try:
                self.worker.wait(30)
            except subprocess.TimeoutExpired:
                self.worker.kill()
                self.worker.wait(10)
            self.worker = None

    def worker_said(self, lines: int = 40) -> str:
        """The end of the worker's log, for a failure's message."""
        said = self.worker_log.read_text(errors="replace").splitlines() if self.worker_log.exists() else []
        return "\n".join(["--- worker log ---", *said[-lines:]])

    def wait_cleaned_up(self, run_id: int, timeout: float) -> None:
        """Until the run's cleanup has ended, complete or not (the run ended first)."""
        wait_for(
            f"run {run_id} to end and be cleaned up",
            lambda: self.show(run_id)["run"]["cleanup_status"] in ("complete", "incomplete"),
            timeout,
            every=0.5,
        )

    def show(self, run_id: int) -> dict[str, Any]:
        shown: dict[str, Any] = self.json("run", "show", str(run_id))
        return shown


def elapsed_since(start: float) -> float:
    return time.monotonic() - start
