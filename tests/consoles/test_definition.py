"""Console definitions are checked as event files are, and what reaches a command is
quoted or refused by the console's rules. Quake 3's transport against a UDP peer that
splits, loses and refuses."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from roadie.consoles import load_console, load_console_file
from roadie.consoles.definition import TransportName
from roadie.consoles.econ import TeeworldsEcon
from roadie.consoles.module import ConsoleWorld, _Commands, tag_pattern
from roadie.consoles.quake3 import Quake3Rcon
from roadie.consoles.transport import ConsoleAuthFailed, ConsoleUnreachable, Pacer, ReplyLost, UnsafeValue
from roadie.errors import DefinitionError

REPO = Path(__file__).resolve().parents[2]

LEDGER = """\
console: arena
transport: quake3
actions:
  bots:
    reversible: ledger
    kind: bot
    ref: "{{ key }}.{{ index }}"
    count: count
    do: addbot {{ bot }} 1 free 0 {{ ref }}
    revert: kick {{ ref }}
    list: status
    params:
      bot: {type: string, default: sarge}
      count: {type: integer, minimum: 1, maximum: 4, default: 1}
"""


def problems(text: str) -> list[str]:
    with pytest.raises(DefinitionError) as caught:
        load_console(text, "c.yaml")
    return [str(p) for p in caught.value.problems]


@pytest.mark.parametrize("path", ["openarena/openarena.yaml", "teeworlds/teeworlds.yaml", "minecraft/minecraft.yaml"])
def test_every_shipped_definition_is_valid(path: str) -> None:
    definition = load_console_file(REPO / "integrations" / path)
    assert definition.actions or definition.leases


def test_a_ledger_action_that_cannot_tag_or_read_back_what_it_makes_is_refused_at_its_line() -> None:
    text = LEDGER.replace('    ref: "{{ key }}.{{ index }}"\n', "").replace("    list: status\n", "")
    assert problems(text) == [
        "c.yaml:4: actions.bots.ref: a 'ledger' action needs 'ref'",
        "c.yaml:4: actions.bots.list: a 'ledger' action needs a read-back: 'list' or 'check' with 'present'",
    ]
    untagged = LEDGER.replace('ref: "{{ key }}.{{ index }}"', 'ref: "bot{{ index }}"')
    assert problems(untagged) == ["c.yaml:7: actions.bots.ref: the tag must hold the step's key: {{ key }}"]


def test_mistakes_are_named_with_their_field_line_and_a_suggestion() -> None:
    text = LEDGER.replace("transport: quake3", "transport: quake3\nadress: 127.0.0.1:1").replace(
        "do: addbot {{ bot }}", "do: addbot {{ bto }}"
    )
    text += "leases:\n  gravity:\n    read: g_gravity\n    parse: 'is:(.*)'\n    write: g_gravity {{ valeu }}\n"
    assert problems(text) == [
        "c.yaml:3: adress: unknown field 'adress' (did you mean 'address'?)",
    ]
    text = text.replace("adress: 127.0.0.1:1\n", "")
    assert problems(text) == [
        "c.yaml:9: actions.bots.do: 'bto' is not a name this template can use (did you mean 'bot'?)",
        "c.yaml:18: leases.gravity.parse: the pattern needs a group named 'value': (?P<value>...)",
        "c.yaml:19: leases.gravity.write: 'valeu' is not a name this template can use (did you mean 'value'?)",
    ]


def test_a_broadcast_cannot_claim_to_be_taken_down_and_a_borrow_belongs_under_leases() -> None:
    text = "console: a\ntransport: teeworlds\nactions:\n  say:\n    reversible: none\n    do: say x\n    revert: y\n"
    assert problems(text) == [
        "c.yaml:7: actions.say.revert: only a 'ledger' action has 'revert': a none one is not taken down"
    ]
    text = "console: a\ntransport: teeworlds\nactions:\n  set:\n    reversible: override\n    do: sv_motd x\n"
    assert problems(text) == [
        "c.yaml:5: actions.set.reversible: a console borrows settings through leases: declare it under leases"
    ]


@pytest.mark.parametrize(
    ("quoting", "refused"),
    [
        (Quake3Rcon.quoting, ['"', ";", "\\", "\n", "\r", "\0", "\x7f"]),
        (TeeworldsEcon.quoting, ['"', "\\", "\n", "\0"]),
    ],
)
def test_a_value_is_quoted_or_refused_never_escaped(quoting: object, refused: list[str]) -> None:
    assert quoting.quote("Orcs, at the gate!") == '"Orcs, at the gate!"'  # type: ignore[attr-defined]
    for char in refused:
        with pytest.raises(UnsafeValue):
            quoting.quote(f"hi{char} kick all")  # type: ignore[attr-defined]


def test_every_value_a_template_puts_into_a_command_passes_the_quoting() -> None:
    world = ConsoleWorld(load_console(LEDGER, "c.yaml"), Quake3Rcon("127.0.0.1", 1, "pw"), None, [])  # type: ignore[arg-type]
    world.commands = _Commands(world.console)
    assert world.render("say {{ m }}", {"m": "hello there"}) == 'say "hello there"'
    assert world.render("g_gravity {{ v }}", {"v": 800.0}) == "g_gravity 800"
    assert world.render("g_gravity {{ v }}", {"v": 0.5}) == "g_gravity 0.5"
    assert world.render("addbot {{ b | word }}", {"b": "sarge"}) == "addbot sarge"
    for template, context in [
        ("say {{ m }}", {"m": 'x"; kick all; "'}),
        ("say {{ m }}", {"m": "x\nkick all"}),
        ("addbot {{ b | word }}", {"b": "sarge kick"}),
        ("say {{ m ~ ';' }}", {"m": "x"}),  # what a template builds is checked too
        ("g_gravity {{ v }}", {"v": float("nan")}),
    ]:
        with pytest.raises(UnsafeValue):
            world.render(template, context)


def test_a_tag_is_found_again_with_the_key_it_holds() -> None:
    definition = load_console(LEDGER, "c.yaml")
    world = ConsoleWorld(definition, Quake3Rcon("127.0.0.1", 1, "pw"), None, [])  # type: ignore[arg-type]
    world.commands = _Commands(world.console)
    status = " 0  0  0 a1b2c3d4e5f6-12-2-3.0 ^7bot\n 1  0  0 a1b2c3d4e5f6-12-2-3.10 ^7bot\n 2 0 0 Player ^7 127.0.0.1"
    found = [(m.group(0), m.group("key")) for m in tag_pattern(world, definition.actions["bots"]).finditer(status)]
    assert found == [
        ("a1b2c3d4e5f6-12-2-3.0", "a1b2c3d4e5f6-12-2-3"),
        ("a1b2c3d4e5f6-12-2-3.10", "a1b2c3d4e5f6-12-2-3"),
    ]
    other = tag_pattern(world, definition.actions["bots"], key="a1b2c3d4e5f6-12-2-30")
    assert other.search(status) is None  # a key that only begins like another is not it


class UdpPeer:
    """A UDP peer that answers each datagram by a rule of the test's."""

    def __init__(self, answer: object) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.answer = answer
        self.received: list[bytes] = []
        self._stop = threading.Event()
        self.sock.settimeout(0.05)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data, addr = self.sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            self.received.append(data)
            for reply in self.answer(data):  # type: ignore[operator]
                self.sock.sendto(b"\xff\xff\xff\xffprint\n" + reply, addr)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def peer_factory() -> Iterator[list[UdpPeer]]:
    made: list[UdpPeer] = []
    yield made
    for peer in made:
        peer.close()


def test_every_pacer_of_one_server_draws_on_one_budget_and_a_lost_reply_empties_it(tmp_path: Path) -> None:
    """ioquake3 counts rcon packets by address, so two processes on one host (a CLI
    command right after another, workers side by side) pace as one; another server's
    budget is its own."""
    now = [1000.0]

    def pacer(key: str) -> Pacer:
        return Pacer(2, 1.0, key=key, directory=tmp_path, clock=lambda: now[0])

    first, second, other = pacer("quake3-h-1"), pacer("quake3-h-1"), pacer("quake3-h-2")
    assert [first.reserve(), first.reserve()] == [0.0, 0.0]
    assert second.reserve() == 1.0  # the burst is spent: the next moment is a second away
    assert first.reserve() == 2.0  # and that one is taken
    assert other.reserve() == 0.0
    now[0] += 3.0  # what was promised is paid, and one is back
    assert second.reserve() == 0.0
    now[0] += 5.0
    first.emptied()  # unanswered: the server's count was full, whatever this host sent
    assert second.reserve() == 1.0
    now[0] += 5.0
    first.emptied(seconds_ago=1.0)  # one interval since it was sent: one may go, no burst
    assert [second.reserve(), second.reserve()] == [0.0, 1.0]
    (tmp_path / "quake3-h-1.bucket").write_text("not a bucket")
    assert first.reserve() == 0.0  # a file not understood is a full bucket, not an error


def test_a_quake3_server_written_two_ways_is_one_budget_named_by_its_address(
    peer_factory: list[UdpPeer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server counts by the address its packets come from and go to, so `127.1` (or
    `localhost`) and `127.0.0.1` in two consoles are one budget: the second console waits
    for the first's command to be paid, and both commands reach the one server."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    peer = UdpPeer(lambda data: [b"ok"])
    peer_factory.append(peer)

    async def both() -> float:
        await Quake3Rcon("127.0.0.1", peer.port, "pw", burst=1, rate=1.0).send("status")
        started = time.monotonic()
        await Quake3Rcon("127.1", peer.port, "pw", burst=1, rate=1.0).send("status")
        return time.monotonic() - started

    waited = asyncio.run(both())
    assert waited >= 0.8  # the one command's worth of budget was spent by the other console
    assert peer.received == [b"\xff\xff\xff\xffrcon pw status"] * 2
    buckets = [p.name for p in tmp_path.rglob("*.bucket")]
    assert buckets == [f"quake3-127.0.0.1-{peer.port}.bucket"]


def test_quake3_joins_a_reply_of_several_datagrams_and_tells_lost_from_refused(peer_factory: list[UdpPeer]) -> None:
    split = UdpPeer(lambda data: [b"first part, ", b"second part"])
    silent = UdpPeer(lambda data: [])
    refusing = UdpPeer(lambda data: [b"Bad rconpassword.\n"])
    peer_factory.extend([split, silent, refusing])

    async def send(port: int) -> str:
        return await Quake3Rcon("127.0.0.1", port, "pw", timeout=0.5).send("status")

    assert asyncio.run(send(split.port)) == "first part, second part"
    assert split.received == [b"\xff\xff\xff\xffrcon pw status"]
    with pytest.raises(ReplyLost):
        asyncio.run(send(silent.port))
    with pytest.raises(ConsoleAuthFailed, match="Bad rconpassword"):
        asyncio.run(send(refusing.port))
    closed = UdpPeer(lambda data: [])
    port = closed.port
    closed.close()
    # Nothing listens: the kernel's ICMP refusal says so at once (ConsoleUnreachable), unless
    # the kernel is rate-limiting its ICMP, when it looks like any other silence.
    with pytest.raises((ConsoleUnreachable, ReplyLost)):
        asyncio.run(send(port))


def test_a_definition_names_transports_it_knows() -> None:
    assert {t.value for t in TransportName} == {"quake3", "teeworlds", "source"}
    assert problems("console: a\ntransport: rcon\n")[0].startswith("c.yaml:2: transport: Input should be")
