"""Teeworlds' external console (`econ`) over TCP: the server asks for a password, then
takes one command a line and prints whatever its console prints, its own log lines
included, each `[time][system]: text` and each ended by a newline and NUL padding.

Nothing marks the end of a command's output, so every command is followed by
`echo MARKER` and the reply is what comes before the marker's line. And every econ
client hears every command's output, its own and the others' (an admin's session,
another worker): the server logs each command it runs as `cid=N cmd='...'` before its
output, so a reply is the lines under the log of this command from this connection's
client id (the one that ran the marker). One connection is kept and opened again after
the server restarts; a connection that breaks after a command was written leaves that
command's fate unknown (`ReplyLost`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import secrets

from roadie.consoles.transport import (
    Quoting,
    ReplyLost,
    TcpConsole,
    check_line,
)

_PREFIX = re.compile(r"^\[[^\]]*\]\[(?P<system>[^\]]*)\]: ?")
_RAN = re.compile(r"^cid=(?P<cid>\d+) cmd='(?P<cmd>.*)'$")  # the server's log of a command it runs


class TeeworldsEcon(TcpConsole):
    """Teeworlds econ. Values are wrapped in double quotes; a quote, a backslash and
    control characters are refused (the console's `;` scan and its tokenizer read `\\`
    differently, so an escaped value could end a string for one and not the other)."""

    name = "teeworlds"
    quoting = Quoting(forbidden='"\\')

    def __init__(self, host: str, port: int, password: str, *, timeout: float = 5.0) -> None:
        super().__init__(host, port, password, timeout=timeout)
        self._markers = itertools.count(1)
        self._session = secrets.token_hex(4)

    async def _login(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> str | None:
        await _line_containing(reader, "password")
        writer.write(self._password.encode() + b"\n")
        await writer.drain()
        answer = await _line_containing(reader, "")
        return None if answer.startswith("Authentication successful") else answer

    async def send(self, command: str) -> str:
        line = check_line(command)
        async with self._lock:
            reader, writer = await self._connect()
            marker = f"roadie-end-{self._session}-{next(self._markers)}"
            try:
                writer.write(f"{line}\necho {marker}\n".encode())
                await writer.drain()
                runs: list[tuple[str, str, list[str]]] = []  # (client id, command, its output)
                unlogged: list[str] = []  # output under no command's log (a server that logs none)
                async with asyncio.timeout(self.timeout):
                    while True:
                        text = await _read_line(reader)
                        match = _PREFIX.match(text)
                        body = text[match.end() :] if match else text
                        ran = _RAN.match(body) if match and match["system"] == "server" else None
                        if ran:
                            runs.append((ran["cid"], ran["cmd"], []))
                        elif body == marker and (not runs or runs[-1][1] == f"echo {marker}"):
                            return _reply(runs, line, marker, unlogged)
                        elif runs:
                            runs[-1][2].append(body)
                        else:
                            unlogged.append(body)
            except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
                await self._drop()
                raise ReplyLost(f"{self.host}:{self.port}: {type(exc).__name__} after the command was sent") from exc

    async def close(self) -> None:
        """Leave by closing this side's half only, and hear the server out until it closes
        its own. Teeworlds 0.7 does not ignore SIGPIPE: a client that hangs up whole may be
        sent a line of somebody else's output before the server notices, and the server
        dies of it. (`logout` would have the server close first, which leaves its econ port
        in TIME_WAIT: a server restarted within the minute after could not bind it.)"""
        async with self._lock:
            if (kept := await self._kept()) is not None:  # (one the server closed is reset)
                reader, writer = kept
                with contextlib.suppress(OSError, TimeoutError):
                    writer.write_eof()
                    async with asyncio.timeout(self.timeout):
                        while await reader.read(1 << 16):  # until the server has closed it
                            pass
            await self._drop()


def _reply(runs: list[tuple[str, str, list[str]]], line: str, marker: str, unlogged: list[str]) -> str:
    """The output logged under `line` as run by the client that ran `marker` (this one)."""
    ours = next((cid for cid, cmd, _ in reversed(runs) if cmd == f"echo {marker}"), None)
    if ours is None:  # the server logs no commands (ec_output_level 0): all that was heard
        return "\n".join(unlogged + [text for _, _, out in runs for text in out])
    mine = [out for cid, cmd, out in runs if cid == ours and cmd == line]
    return "\n".join(mine[-1]) if mine else ""


async def _read_line(reader: asyncio.StreamReader) -> str:
    while True:
        raw = await reader.readuntil(b"\n")
        text = raw.replace(b"\0", b"").decode("utf-8", "replace").strip()
        if text:
            return text


async def _line_containing(reader: asyncio.StreamReader, word: str) -> str:
    while True:
        text = await _read_line(reader)
        if word.lower() in text.lower():
            return text
