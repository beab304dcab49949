"""A Source RCON server written from Valve's published specification, for the transport's
tests: there is no Minecraft or Source server to install from the package registries.

It authenticates as the specification says (an id of -1 for a wrong password; as a Source
server, an empty SERVERDATA_RESPONSE_VALUE before the SERVERDATA_AUTH_RESPONSE, which
Minecraft does not send), splits a reply into bodies of at most 4096 bytes with no marker,
and answers the few Minecraft commands the shipped example uses, over a world of tagged
entities, game rules and a time of day.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import struct
import threading
from typing import Any

SPLIT = 4096


def packet(packet_id: int, kind: int, body: bytes) -> bytes:
    payload = struct.pack("<ii", packet_id, kind) + body + b"\0\0"
    return struct.pack("<i", len(payload)) + payload


class SourceServer:
    def __init__(self, password: str, *, flavour: str = "minecraft") -> None:
        self.password = password
        self.flavour = flavour  # "minecraft" or "source"
        self.entities: list[tuple[str, set[str]]] = []
        self.rules = {"doDaylightCycle": "true", "doMobSpawning": "true"}
        self.time = 1000
        self.commands: list[str] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    def hang_up(self) -> None:
        """Close every client's connection, as a server that restarts does."""

        async def hang_up() -> None:
            for writer in self._writers:
                writer.close()
            for writer in self._writers:
                with contextlib.suppress(ConnectionError):
                    await writer.wait_closed()

        asyncio.run_coroutine_threadsafe(hang_up(), self._loop).result(10)

    def close(self) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        authed = False
        self._writers.append(writer)
        try:
            while True:
                (size,) = struct.unpack("<i", await reader.readexactly(4))
                data = await reader.readexactly(size)
                packet_id, kind = struct.unpack("<ii", data[:8])
                body = data[8:].split(b"\0")[0].decode()
                if kind == 3:
                    if self.flavour == "source":
                        writer.write(packet(packet_id, 0, b""))
                    authed = body == self.password
                    writer.write(packet(packet_id if authed else -1, 2, b""))
                elif kind == 2 and authed:
                    self.commands.append(body)
                    reply = self.answer(body).encode()
                    for start in range(0, max(len(reply), 1), SPLIT):
                        writer.write(packet(packet_id, 0, reply[start : start + SPLIT]))
                elif kind == 2:
                    writer.write(packet(-1, 2, b""))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            writer.close()

    def answer(self, command: str) -> str:
        if found := re.fullmatch(r'summon ([a-z_:]+) -?\d+ -?\d+ -?\d+ \{Tags:\["roadie","([^"]+)"\].*\}', command):
            self.entities.append((found.group(1), {"roadie", found.group(2)}))
            return f"Summoned new {found.group(1)}"
        if found := re.fullmatch(r"kill @e\[tag=([^\]]+)\]", command):
            before = len(self.entities)
            self.entities = [e for e in self.entities if found.group(1) not in e[1]]
            killed = before - len(self.entities)
            return f"Killed {killed} entities" if killed else "No entity was found"
        if found := re.fullmatch(r"execute if entity @e\[tag=([^\]]+)\]", command):
            count = sum(1 for e in self.entities if found.group(1) in e[1])
            return f"Test passed, count: {count}" if count else "Test failed"
        if found := re.fullmatch(r"gamerule (\w+)(?: (true|false))?", command):
            if found.group(2):
                self.rules[found.group(1)] = found.group(2)
                return f"Gamerule {found.group(1)} is now set to: {found.group(2)}"
            return f"Gamerule {found.group(1)} is currently set to: {self.rules[found.group(1)]}"
        if command == "time query daytime":
            return f"The time is {self.time}"
        if found := re.fullmatch(r"time set (\d+)", command):
            self.time = int(found.group(1))
            return f"Set the time to {self.time}"
        if command == "list":
            return "There are 0 of a max of 20 players online: "
        if found := re.fullmatch(r"big (\d+)", command):
            return "".join(chr(ord("a") + i % 26) for i in range(int(found.group(1))))
        if found := re.fullmatch(r'tellraw @a \{"text":"([^"]*)"\}', command):
            return ""
        return "Unknown or incomplete command, see below for error"

    def world(self) -> dict[str, Any]:
        return {
            "entities": sorted((e, sorted(t)) for e, t in self.entities),
            "rules": dict(self.rules),
            "time": self.time,
        }
