"""What every console transport shares: the errors a console call ends in, the rules by
which a value may reach a command, and pacing.

A console is a text channel to a game server's own command interpreter. Three things make
it unlike a module's HTTP endpoint, and each transport is written around them: a reply
has no status (the text is all there is), a reply may never come while the command did
run (UDP), and anything spliced into a command line is parsed by the server's own
tokenizer, which knows separators (`;`, a newline) that would start a second command.
"""

from __future__ import annotations

import asyncio
import re
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

from roadie.errors import RoadieError

MAX_COMMAND = 900
"""The longest command line sent, in bytes: Quake 3 reads at most 1024 bytes of a
datagram and its password comes first; Teeworlds' econ lines are shorter still."""


class ConsoleError(RoadieError):
    """The game server's console failed."""


class ConsoleUnreachable(ConsoleError):
    """The console could not be reached: nothing was sent, so nothing was done."""


class ConsoleAuthFailed(ConsoleError):
    """The console refused the password. Retrying with the same one cannot help."""


class ReplyLost(ConsoleError):
    """The command was sent and no reply came: it may or may not have been carried out.
    Never send it again blindly: read the world back first."""


class UnsafeValue(ConsoleError):
    """A value cannot be put into a command line safely."""


@dataclass(frozen=True)
class Quoting:
    """How one console's tokenizer reads a value: the characters that could end the value
    or start another command, which are refused (never escaped: escaping rules differ
    between a console's separator scan and its tokenizer, and a value that slips between
    the two becomes a second command), and whether a value is wrapped in double quotes."""

    forbidden: str
    wrap: bool = True
    true: str = "1"
    false: str = "0"

    def quote(self, value: str) -> str:
        for char in value:
            if ord(char) < 0x20 or ord(char) == 0x7F or char in self.forbidden:
                raise UnsafeValue(f"{value!r}: {_describe(char)} cannot be sent to this console")
        return f'"{value}"' if self.wrap else value


def _describe(char: str) -> str:
    names = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab", ";": "';'", '"': "a double quote"}
    return names.get(char, f"{char!r}")


WORD = re.compile(r"^[A-Za-z0-9_.:+@#=-]+$")
"""What a value may be to be sent bare (unquoted): one word of safe characters."""


def check_line(command: str) -> str:
    """Refuse a finished command line that a console would read as more than one line."""
    if "\n" in command or "\r" in command or "\0" in command:
        raise UnsafeValue(f"{command[:60]!r}: a command is one line")
    if len(command.encode()) > MAX_COMMAND:
        raise UnsafeValue(f"{command[:60]!r}...: longer than {MAX_COMMAND} bytes")
    return command


class Pacer:
    """A token bucket: at most `burst` commands at once, then one each `1/rate` seconds.

    ioquake3 answers at most ten rcon packets from one address in a burst, then one a
    second, and drops the rest without a word, which would look exactly like a reply
    lost; so a quake3 console is paced a little under that."""

    def __init__(self, burst: int, rate: float) -> None:
        self.burst = burst
        self.interval = 1.0 / rate
        self._tokens = float(burst)
        self._at = time.monotonic()
        self._lock = asyncio.Lock()

    async def wait(self) -> None:
        async with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._at) / self.interval)
            self._at = now
            if self._tokens < 1:
                await asyncio.sleep((1 - self._tokens) * self.interval)
                self._tokens = 1.0
                self._at = time.monotonic()
            self._tokens -= 1


class Console(ABC):
    """One game server's console, as the console module uses it."""

    name: str
    quoting: Quoting
    acknowledged: bool
    """Whether a reply always comes for a command carried out (TCP): over UDP it may not."""

    def __init__(self, host: str, port: int, password: str, *, timeout: float = 3.0) -> None:
        self.host = host
        self.port = port
        self._password = password
        self.timeout = timeout

    @abstractmethod
    async def send(self, command: str) -> str:
        """Send one command line and return its reply's text. Raises `ConsoleUnreachable`
        when nothing was sent, `ReplyLost` when it was and no reply came, and
        `ConsoleAuthFailed` when the password is refused."""

    async def read(self, command: str, *, attempts: int = 3) -> str:
        """A command that changes nothing (a read), sent again while its reply is lost."""
        for attempt in range(attempts):
            try:
                return await self.send(command)
            except (ReplyLost, ConsoleUnreachable):
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    async def close(self) -> None:
        return None

    def __repr__(self) -> str:  # never the password
        return f"<{type(self).__name__} {self.host}:{self.port}>"


class TcpConsole(Console):
    """A console over one kept TCP connection (Teeworlds econ, Source RCON): one command
    at a time on it, and a connection that broke is opened again by the next command."""

    acknowledged = True

    def __init__(self, host: str, port: int, password: str, *, timeout: float) -> None:
        super().__init__(host, port, password, timeout=timeout)
        self._lock = asyncio.Lock()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """The connection, while it is open."""
        if self._reader is not None and self._writer is not None and not self._writer.is_closing():
            return self._reader, self._writer
        return None

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """The kept connection, or a new one logged in: nothing is sent on a connection that
        could not be made (`ConsoleUnreachable`) or whose password was refused."""
        if (kept := self._open()) is not None:
            return kept
        try:
            async with asyncio.timeout(self.timeout):
                reader, writer = await asyncio.open_connection(self.host, self.port)
                refused = await self._login(reader, writer)
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            raise ConsoleUnreachable(f"{self.host}:{self.port}: {type(exc).__name__} {exc}".strip()) from exc
        if refused is not None:
            writer.close()
            raise ConsoleAuthFailed(f"{self.host}:{self.port}: {refused}")
        self._reader, self._writer = reader, writer
        return reader, writer

    @abstractmethod
    async def _login(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> str | None:
        """Give the password on a new connection: None when the console let us in, else
        what it said instead."""

    async def _drop(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()

    async def close(self) -> None:
        await self._drop()
