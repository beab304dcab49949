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
import contextlib
import fcntl
import math
import os
import re
import socket
import stat
import struct
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from roadie.errors import RoadieError
from roadie.log import get_logger

log = get_logger(__name__)

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
    second, and drops the rest without a word, which looks exactly like a reply lost; so a
    quake3 console is paced a little under that. The server counts by address, not by
    process, so with a `key` the bucket is a file every process of this user on this host
    shares (a `roadie cleanup` right after a `roadie run start` spends what is left of the
    same budget, and so do workers side by side). A command is given the next free moment
    under the file's lock and waits for it outside the lock."""

    def __init__(
        self, burst: int, rate: float, *, key: str | None = None, directory: Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:  # fmt: skip
        self.burst = burst
        self.interval = 1.0 / rate
        self._clock = clock
        self._tokens, self._at = float(burst), clock()
        self._path = _bucket_file(key, directory) if key is not None else None

    async def wait(self) -> None:
        """Until this command may be sent."""
        delay = self.reserve()
        if delay > 0:
            await asyncio.sleep(delay)

    def reserve(self) -> float:
        """Take the next free moment for a command: how many seconds from now it is."""
        return max(0.0, -self._count(spend=1) * self.interval)

    def emptied(self, seconds_ago: float = 0.0) -> None:
        """A command sent `seconds_ago` went unanswered. A server that dropped it had a
        full count for this address (a process on another host, or one pacing alone), so
        the bucket is taken as empty then: no burst follows, only what the server has
        let go of since."""
        self._count(spend=0, cap=max(0.0, seconds_ago) / self.interval)

    def _count(self, *, spend: int, cap: float | None = None) -> float:
        """The bucket's level now, at most `cap`, less `spend`: below zero, the moments
        already promised."""
        with self._bucket() as state:
            now = self._clock()
            elapsed = max(0.0, now - state[1])  # never below nothing, were the clock set back
            level = min(self.burst, state[0] + elapsed / self.interval)
            if cap is not None:
                level = min(level, cap)
            state[:] = [level - spend, now]
        return state[0]

    @contextlib.contextmanager
    def _bucket(self) -> Iterator[list[float]]:
        """The bucket's level and when it was last counted, to change in place; kept in the
        shared file under its lock, or in this object when there is no file to share."""
        if self._path is not None:
            try:
                fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            except OSError as exc:
                log.warning("console pacing is not shared between processes", file=str(self._path), error=str(exc))
                self._path = None
            else:
                with os.fdopen(fd, "r+") as handle:
                    fcntl.flock(handle, fcntl.LOCK_EX)
                    state = _parse_bucket(handle.read(), self.burst, self._clock())
                    yield state
                    handle.seek(0)
                    handle.truncate()
                    handle.write(f"{state[0]!r} {state[1]!r}\n")
                return
        state = [self._tokens, self._at]
        yield state
        self._tokens, self._at = state


def _parse_bucket(text: str, burst: int, now: float) -> list[float]:
    try:
        level, at = (float(part) for part in text.split())
    except ValueError:  # new, or not ours: a full bucket
        return [float(burst), now]
    return [level, at] if math.isfinite(level) and math.isfinite(at) else [float(burst), now]


def _bucket_file(key: str, directory: Path | None) -> Path | None:
    """Where the bucket of `key` is shared: in the user's runtime directory, else in a
    directory of the user's own under the system's temporary one; None (each process
    paces alone) when no such directory can be had."""
    if directory is None:
        runtime = os.environ.get("XDG_RUNTIME_DIR")
        base = Path(runtime) if runtime else Path(tempfile.gettempdir())
        directory = base / f"roadie-pacing-{os.getuid()}"
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = directory.lstat()
    except OSError as exc:
        log.warning("console pacing is not shared between processes", directory=str(directory), error=str(exc))
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        log.warning("console pacing is not shared between processes: the directory is not this user's own",
                    directory=str(directory))  # fmt: skip
        return None
    return directory / (re.sub(r"[^A-Za-z0-9.-]", "_", key) + ".bucket")


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

    async def _kept(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """The kept connection if the server has not closed it, what already waited on it
        read and dropped; one the server closed is reset (`_reset_on_close`) and let go."""
        if (kept := self._open()) is None:
            return None
        if await _still_open(kept[0]):
            return kept
        _reset_on_close(kept[1])
        await self._drop()
        return None

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """The kept connection, or a new one logged in: nothing is sent on a connection that
        could not be made (`ConsoleUnreachable`) or whose password was refused."""
        if (kept := await self._kept()) is not None:
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


async def _still_open(reader: asyncio.StreamReader) -> bool:
    """Whether a kept connection is still open, having read and dropped what already waits
    on it (output that came while no command was waiting, never the reply to one not yet
    sent). A server that restarted, or dropped this client, closed it: found now, a new
    connection carries the command, whose fate is then not left unknown."""
    while True:
        try:
            async with asyncio.timeout(0):  # what is there already; never a wait
                if not await reader.read(1 << 16):
                    return False
        except TimeoutError:
            return True


def _reset_on_close(writer: asyncio.StreamWriter) -> None:
    """Have closing this connection, which the server has closed already, reset it. A
    plain close would leave the server's side in TIME_WAIT for a minute, and a server that
    binds its port without SO_REUSEADDR (Teeworlds) and restarts meanwhile would have no
    console; a reset frees the port at once. (Only once the server has closed: a reset on
    a connection the server still writes to gets it SIGPIPE, which kills Teeworlds.)"""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
