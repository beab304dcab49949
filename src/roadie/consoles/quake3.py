"""Quake 3 `rcon` over UDP: ioquake3 and the games on it (OpenArena, Urban Terror...).

A request is one datagram, `\\xff\\xff\\xff\\xffrcon PASSWORD COMMAND`; the reply is one or
more datagrams `\\xff\\xff\\xff\\xffprint\\n TEXT` (the server flushes its output buffer,
about 1000 bytes, as it fills), with no marker for the last. Nothing acknowledges a
request: a reply lost and a request lost look the same, and so does a request the server
dropped for coming too fast (past a burst of ten, one a second per address: the pacing is
shared by the processes of one host, see `Pacer`). Each command gets a socket of its own, so
a late reply to an earlier command can never be read as this one's.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

from roadie.consoles.transport import (
    Console,
    ConsoleAuthFailed,
    ConsoleUnreachable,
    Pacer,
    Quoting,
    ReplyLost,
    check_line,
)

HEADER = b"\xff\xff\xff\xff"
PRINT = HEADER + b"print\n"
QUIET = 0.15
"""After a reply's datagram, how long to wait for another before taking the reply as whole."""


class _Reply(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.arrived = asyncio.Event()
        self.error: Exception | None = None
        self.last = 0.0

    def datagram_received(self, data: bytes, addr: object) -> None:
        if data.startswith(PRINT):
            self.parts.append(data[len(PRINT) :])
            self.last = time.monotonic()
            self.arrived.set()

    def error_received(self, exc: Exception) -> None:  # ICMP port unreachable: no server there
        self.error = exc
        self.arrived.set()


class Quake3Rcon(Console):
    """Quake 3 rcon. Values are wrapped in double quotes, inside which the tokenizer takes
    everything but a quote; `;` and `\\` are refused as well (a userinfo string, which a
    bot's name becomes, splits on `\\`, and scripts run through `vstr` split on `;`)."""

    name = "quake3"
    quoting = Quoting(forbidden='";\\')
    acknowledged = False

    def __init__(
        self, host: str, port: int, password: str, *, timeout: float = 2.0, burst: int = 8, rate: float = 0.9
    ) -> None:
        super().__init__(host, port, password, timeout=timeout)
        self._burst, self._rate = burst, rate
        self._peer: tuple[int, Any, Pacer] | None = None  # family, sockaddr, and its budget

    async def _resolved(self) -> tuple[int, Any, Pacer]:
        """The server's address, looked up once, and the budget the server keeps for it:
        named by the address resolved, not as written (`localhost` and `127.0.0.1` are
        one budget), and each command goes to the address its budget is for."""
        if self._peer is None:
            loop = asyncio.get_running_loop()
            try:
                [(family, _, _, _, sockaddr), *_] = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_DGRAM)
            except OSError as exc:
                raise ConsoleUnreachable(f"{self.host}:{self.port}: {exc}") from exc
            address = str(sockaddr[0])  # an IP address's text (IPv4 or IPv6)
            self._peer = family, sockaddr, Pacer(self._burst, self._rate, key=f"quake3-{address}-{self.port}")
        return self._peer

    async def send(self, command: str) -> str:
        packet = HEADER + b"rcon " + self._password.encode() + b" " + check_line(command).encode()
        family, sockaddr, pacer = await self._resolved()
        await pacer.wait()
        loop = asyncio.get_running_loop()
        try:
            transport, reply = await loop.create_datagram_endpoint(_Reply, remote_addr=sockaddr, family=family)
        except OSError as exc:
            raise ConsoleUnreachable(f"{self.host}:{self.port}: {exc}") from exc
        try:
            sent = time.monotonic()
            transport.sendto(packet)
            try:
                async with asyncio.timeout(self.timeout):
                    await reply.arrived.wait()
                    while True:  # more datagrams of the same reply, until the line is quiet
                        reply.arrived.clear()
                        if reply.error is not None:
                            break
                        wait = reply.last + QUIET - time.monotonic()
                        if wait <= 0:
                            break
                        try:
                            async with asyncio.timeout(wait):
                                await reply.arrived.wait()
                        except TimeoutError:
                            break
            except TimeoutError:
                if not reply.parts:
                    pacer.emptied(time.monotonic() - sent)
                    raise ReplyLost(f"{self.host}:{self.port}: no reply within {self.timeout:g}s") from None
        finally:
            transport.close()
        if reply.error is not None and not reply.parts:
            # Refused at once (ICMP): the datagram reached no server, so nothing was done.
            raise ConsoleUnreachable(f"{self.host}:{self.port}: {reply.error}")
        text = b"".join(reply.parts).decode("utf-8", "replace")
        first = text.lstrip().splitlines()[0] if text.strip() else ""
        if first.startswith("Bad rconpassword") or first.startswith("No rconpassword set"):
            raise ConsoleAuthFailed(f"{self.host}:{self.port}: {first.strip()}")
        return text
