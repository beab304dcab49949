"""Source RCON over TCP (Valve's protocol, spoken by Minecraft, Rust, ARK, Palworld,
Factorio, CS2...). Experimental: it is tested against the packet layout of Valve's
published specification and a server written from it, not against a real game server.

A packet is `size, id, type` (little-endian int32) then a NUL-ended body and one more
NUL. One connection is authenticated once (type 3; the answer's id is -1 when the
password is wrong) and kept. A reply longer than one packet is split with no marker, and
Minecraft does not echo the empty packet Source servers do, so each command is followed
by a second command with an id of its own: the reply is every packet with the first id
that came before the first packet with the second.
"""

from __future__ import annotations

import asyncio
import itertools
import struct

from roadie.consoles.transport import (
    ConsoleError,
    Quoting,
    ReplyLost,
    TcpConsole,
    check_line,
)

AUTH = 3
AUTH_RESPONSE = 2
EXEC = 2
RESPONSE_VALUE = 0
MAX_PACKET = 4096 + 14


def encode(packet_id: int, kind: int, body: str) -> bytes:
    """One packet: its size counts everything after the size field itself."""
    payload = struct.pack("<ii", packet_id, kind) + body.encode("utf-8") + b"\0\0"
    return struct.pack("<i", len(payload)) + payload


async def read_packet(reader: asyncio.StreamReader) -> tuple[int, int, str]:
    (size,) = struct.unpack("<i", await reader.readexactly(4))
    if not 10 <= size <= 65536:
        raise ConsoleError(f"a packet of {size} bytes is not Source RCON")
    data = await reader.readexactly(size)
    packet_id, kind = struct.unpack("<ii", data[:8])
    return packet_id, kind, data[8:].rstrip(b"\0").decode("utf-8", "replace")


class SourceRcon(TcpConsole):
    """Source RCON. Each packet is one command, and Minecraft's and Source's tokenizers
    both read a double-quoted string; values are wrapped, and a quote, `;` (a separator
    in Source engine consoles) and control characters are refused."""

    name = "source"
    quoting = Quoting(forbidden='";\\', true="true", false="false")

    def __init__(self, host: str, port: int, password: str, *, timeout: float = 5.0, marker: str = "") -> None:
        super().__init__(host, port, password, timeout=timeout)
        self.marker = marker  # the second command that ends a reply
        self._ids = itertools.count(1)

    async def _login(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> str | None:
        auth_id = next(self._ids)
        writer.write(encode(auth_id, AUTH, self._password))
        await writer.drain()
        while True:  # Source servers send an empty RESPONSE_VALUE first
            packet_id, kind, _ = await read_packet(reader)
            if kind == AUTH_RESPONSE:
                break
        return None if packet_id == auth_id else "the RCON password was refused"

    async def send(self, command: str) -> str:
        line = check_line(command)
        async with self._lock:
            reader, writer = await self._connect()
            command_id, marker_id = next(self._ids), next(self._ids)
            try:
                writer.write(encode(command_id, EXEC, line) + encode(marker_id, EXEC, self.marker))
                await writer.drain()
                parts: list[str] = []
                async with asyncio.timeout(self.timeout):
                    while True:
                        packet_id, _, body = await read_packet(reader)
                        if packet_id == marker_id:
                            return "".join(parts)
                        if packet_id == command_id:
                            parts.append(body)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ConsoleError) as exc:
                await self._drop()
                raise ReplyLost(f"{self.host}:{self.port}: {type(exc).__name__} after the command was sent") from exc
