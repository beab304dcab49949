"""`roadie sandbox serve` in a process of its own, for the tests that cross the network."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from roadie import protocol

SECRET = "loopback-test-secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SandboxServer:
    """The sandbox world as a remote module server, which a test may kill -9 and restart
    on the same files and port."""

    def __init__(
        self, home: Path, *flags: str, port: int | None = None, pull: str | None = None, host: str = "127.0.0.1"
    ) -> None:
        self.home = home
        self.host = host
        self.world = home / "world.db"
        self.ledger = home / "world-keys.db"
        self.port = port or free_port()
        self.flags = list(flags)
        self.pull = pull
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = home / "server.log"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, *, wait: bool = True) -> SandboxServer:
        command = [
            str(Path(sys.executable).parent / "roadie"), "--log-level", "info", "sandbox", "serve",
            "--host", self.host, "--port", str(self.port), "--db", str(self.world), "--ledger", str(self.ledger),
            "--secret", SECRET, *self.flags,
        ]  # fmt: skip
        if self.pull:
            command += ["--pull", self.pull]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ})
        if wait and not self.pull:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"sandbox serve exited {self.proc.returncode}:\n{self.log.read_text()[-2000:]}")
            try:
                headers = protocol.sign(SECRET, "GET", protocol.MANIFEST, b"")
                if httpx.get(self.url + protocol.MANIFEST, headers=headers, timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"sandbox serve did not answer in {timeout}s:\n{self.log.read_text()[-2000:]}")

    def answers_dropped(self) -> int:
        """Answers the server dropped on purpose (--lose-answers), by its log."""
        return self.log.read_text(errors="replace").count("on purpose")

    def kill(self) -> None:
        """kill -9: no goodbye, nothing flushed that was not already committed."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
