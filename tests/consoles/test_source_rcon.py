"""Source RCON (experimental): the packet layout of Valve's specification, replies split
past 4096 bytes read whole, a refused password, a Source server's extra packet at login, a
server that restarts, and the shipped Minecraft example checked end to end against a
server written from the specification (tests/consoles/source_server.py) — not a real
Minecraft server, which cannot be installed here."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from roadie.clock import SystemClock
from roadie.conformance.inprocess import check_module
from roadie.consoles import attach_console_modules
from roadie.consoles.source_rcon import SourceRcon, encode
from roadie.consoles.transport import ConsoleAuthFailed, ConsoleUnreachable, UnsafeValue
from roadie.errors import PermanentError
from roadie.registry import Call, build_registry
from tests.consoles.source_server import SourceServer

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "spec-password"


@pytest.fixture(params=["minecraft", "source"])
def server(request: pytest.FixtureRequest) -> Iterator[SourceServer]:
    running = SourceServer(PASSWORD, flavour=request.param)
    yield running
    running.close()


def test_a_packet_is_laid_out_as_the_specification_says() -> None:
    # size (not counting itself), id, type, the body and its NUL, and an empty string's NUL
    assert encode(0, 3, "passwrd") == bytes.fromhex("110000000000000003000000706173737772640000")
    assert encode(7, 2, "") == bytes.fromhex("0a00000007000000020000000000")  # the smallest: 10


def test_a_reply_split_across_packets_is_read_whole_and_the_next_is_not_mixed_in(server: SourceServer) -> None:
    async def go() -> tuple[str, str]:
        console = SourceRcon("127.0.0.1", server.port, PASSWORD)
        try:
            return await console.send("big 10000"), await console.send("time query daytime")
        finally:
            await console.close()

    long, short = asyncio.run(go())
    assert long == "".join(chr(ord("a") + i % 26) for i in range(10000))  # three packets, in order
    assert short == "The time is 1000"


def test_a_connection_the_server_closed_while_idle_is_opened_again_before_the_command(server: SourceServer) -> None:
    """A server that restarts (or drops its clients) between two commands: the next one is
    sent on a new connection and answered, not written into the closed one and reported
    as possibly lost (which makes a write read the world back before going on)."""

    async def go() -> list[str]:
        console = SourceRcon("127.0.0.1", server.port, PASSWORD)
        try:
            first = await console.send("time set 2000")
            server.hang_up()
            async with asyncio.timeout(10):  # until this side has heard the hang-up
                while not console._reader or not console._reader.at_eof():
                    await asyncio.sleep(0.01)
            return [first, await console.send("time query daytime"), await console.send("time query daytime")]
        finally:
            await console.close()

    assert asyncio.run(go()) == ["Set the time to 2000", "The time is 2000", "The time is 2000"]
    assert server.commands.count("time query daytime") == 2


def test_a_refused_password_is_an_authentication_failure(server: SourceServer) -> None:
    async def go() -> None:
        console = SourceRcon("127.0.0.1", server.port, "wrong")
        try:
            await console.send("list")
        finally:
            await console.close()

    with pytest.raises(ConsoleAuthFailed, match="refused"):
        asyncio.run(go())


def test_a_server_that_is_gone_is_unreachable_and_a_value_that_would_end_the_command_is_refused() -> None:
    server = SourceServer(PASSWORD)
    port = server.port
    server.close()

    async def go() -> None:
        console = SourceRcon("127.0.0.1", port, PASSWORD)
        await console.send("list")

    with pytest.raises(ConsoleUnreachable):
        asyncio.run(go())
    for value in ['a"b', "a;b", "a\nb", "a\\b", "a\rb"]:
        with pytest.raises(UnsafeValue):
            SourceRcon.quoting.quote(value)
    assert SourceRcon.quoting.quote("two words") == '"two words"'


def test_the_minecraft_example_conforms_against_a_server_written_from_the_specification(
    server: SourceServer, tmp_path: Path
) -> None:
    modules = {
        "mc": {
            "console": str(REPO / "integrations/minecraft/minecraft.yaml"),
            "address": f"127.0.0.1:{server.port}",
            "password": PASSWORD,
        }
    }
    before = server.world()

    async def go() -> dict[str, str]:
        registry = build_registry({}, base_dir=str(tmp_path), discover=False)
        attach_console_modules(registry, modules, base_dir=str(tmp_path))
        try:
            report = await check_module(
                registry, "mc", params={"summon": {"entity": "zombie", "count": 3}, "say": {"message": "hi there"}}
            )
        finally:
            await registry.close()
        return {r.rule: f"{r.outcome} {r.detail}" for r in report.results}

    outcomes = asyncio.run(go())
    assert "refused (Superseded)" in outcomes["fences"]
    assert all(o.startswith("pass") for o in outcomes.values()), outcomes
    assert outcomes["action mc.summon"].startswith("pass made 3")
    assert server.world() == before
    summoned = Counter(re.findall(r'"roadie\.(\S+)\.\d+"', c)[0] for c in server.commands if c.startswith("summon "))
    # The action's check and the fences check, each under a key of its own: done again
    # under the same key (or refused under a stale fence), nothing more was summoned.
    assert list(summoned.values()) == [3, 3]
    assert 'tellraw @a {"text":"hi there"}' in server.commands


def test_a_refused_password_fails_a_ledger_step_for_good_instead_of_retrying_it(
    server: SourceServer, tmp_path: Path
) -> None:
    """A console that refuses the password cannot be helped by a retry under the same
    key: the step fails permanently, with the console's reason."""
    modules = {
        "mc": {
            "console": str(REPO / "integrations/minecraft/minecraft.yaml"),
            "address": f"127.0.0.1:{server.port}",
            "password": "not-the-password",
        }
    }

    async def go() -> None:
        registry = build_registry({}, base_dir=str(tmp_path), discover=False)
        attach_console_modules(registry, modules, base_dir=str(tmp_path))
        action = registry.action("mc.summon")
        call = Call(
            1, 1, "a1b2c3d4e5f6-1-0-0", 1, action.params.model_validate({}), registry.state("mc"), SystemClock()
        )
        try:
            await action.call(call)
        finally:
            await registry.close()

    with pytest.raises(PermanentError, match="RCON password was refused"):
        asyncio.run(go())
    assert server.commands == []
