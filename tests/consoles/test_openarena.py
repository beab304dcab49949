"""OpenArena, a real ioquake3 server reached only by rcon over UDP, as a Roadie world
described by the shipped definition (integrations/openarena/openarena.yaml): an event is
set up and taken down exactly, a server killed mid-event is handled as its policy says, a
lost reply adds no bot twice, and a cleanup that cannot reach the server says so and
finishes when it can."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.consoles.servers import OPENARENA, PASSWORD, LossyProxy, OpenArena, Project, require, wait_for

DEFINITION = "integrations/openarena/openarena.yaml"
pytestmark = pytest.mark.timeout(400)

INVASION = """
id: moon_invasion
title: Low-gravity bot invasion
cleanup: {cleanup}
phases:
  - name: setup
    steps:
      - {{action: core.lease, with: {{lease: arena.gravity, value: 200}}}}
      - {{action: core.lease, with: {{lease: arena.motd, value: "Bots from the moon, beware"}}}}
      - {{action: arena.broadcast, with: {{message: "Low gravity! Bots incoming"}}}}
  - name: wave one
    steps:
      - {{action: arena.bots, with: {{bot: sarge, count: 2}}}}
  - name: wave two
    after: {after}
    steps:
      - action: arena.bots
        with: {{bot: grunt, count: 3, skill: 3}}
        retry: {{attempts: 30, backoff: 0.5, max_backoff: 2}}
"""


@pytest.fixture
def arena(tmp_path: Path) -> Iterator[OpenArena]:
    require(OPENARENA, "openarena-server")
    server = OpenArena(tmp_path / "openarena")
    try:
        server.start()
        yield server
    except BaseException:
        print("--- openarena log ---\n" + server.log_tail())
        raise
    finally:
        server.stop()


def _keys(project: Project, run_id: int) -> set[str]:
    return {s["idempotency_key"] for s in project.show(run_id)["steps"]}


def _made_by(bots: list[str], keys: set[str]) -> list[str]:
    return [b for b in bots if b.rpartition(".")[0] in keys]


def test_an_invasion_is_set_up_over_rcon_and_cleanup_puts_the_server_back_exactly(
    arena: OpenArena, tmp_path: Path
) -> None:
    project = Project(tmp_path / "roadie", "arena", DEFINITION, f"127.0.0.1:{arena.port}")
    before = arena.world()
    assert before["bots"] == []
    (project.home / "invasion.yaml").write_text(INVASION.format(cleanup="manual", after="0s"))

    run_id = project.json("run", "start", "invasion.yaml", "--wait")["id"]
    shown = project.show(run_id)
    assert shown["run"]["status"] == "succeeded", shown
    keys = _keys(project, run_id)
    during = arena.world()
    assert during["gravity"] == "200"
    assert during["motd"] == "Bots from the moon, beware"
    assert len(_made_by(during["bots"], keys)) == 5 == len(during["bots"])
    bots = [r for r in shown["resources"] if r["kind"] == "bot"]
    assert sorted(r["ref"] for r in bots) == sorted(during["bots"])

    report = project.json("cleanup", str(run_id))
    assert (report["status"], report["verdict"]) == ("complete", "verified_clean"), report
    assert (report["reverted"], report["restored"], report["failed"]) == (5, 2, 0)
    assert arena.world() == before

    # A bot carrying the ended run's key that no ledger row names (what an answer lost for
    # good would leave) is found by its tag and taken down by the orphan sweep.
    stray = f"{sorted(keys)[-1]}.7"
    arena.rcon(f"addbot sarge 1 free 0 {stray}")
    wait_for("the stray bot", lambda: arena.bots() == [stray], 30, every=0.5)
    swept = {s["module"]: s for s in project.json("sweep")}
    assert (swept["arena"]["orphans"], swept["arena"]["reverted"]) == (1, 1), swept
    assert arena.world() == before


def test_a_server_killed_mid_event_forgets_its_bots_and_settings_and_cleanup_still_ends_exact(
    arena: OpenArena, tmp_path: Path
) -> None:
    """ioquake3 keeps bots and settings in memory only: a SIGKILL loses them, and the
    restarted server reads its configuration again. The next wave is retried until the
    server is back (its policy), and cleanup finds the rest already gone: a revert of what
    no longer exists is a success, and a setting already back is not written again. The
    worker's look at a run's borrows is off, so that cleanup meets what the restart lost."""
    project = Project(tmp_path / "roadie", "arena", DEFINITION, f"127.0.0.1:{arena.port}", keep_interval=0)
    before = arena.world()
    (project.home / "invasion.yaml").write_text(INVASION.format(cleanup="auto", after="4s"))
    applied = project.run("event", "apply", "invasion.yaml")
    assert applied.returncode == 0, applied.stderr
    run_id = project.json("run", "start", "moon_invasion")["id"]
    project.start_worker()
    try:
        wait_for("the first wave", lambda: len(arena.bots()) == 2, 120, every=0.5)
        assert arena.cvar("g_gravity") == "200"
        arena.kill()  # during the wait before wave two
        arena.start()
        assert arena.world() == before  # what the server forgot
        project.wait_cleaned_up(run_id, 180)
    finally:
        project.stop_worker()
    shown = project.show(run_id)
    assert shown["run"]["status"] == "succeeded", shown
    assert shown["run"]["cleanup_status"] == "complete", shown
    wave_two = [s for s in shown["steps"] if s["phase"] == 2]
    assert wave_two[0]["status"] == "succeeded"
    assert arena.world() == before
    report = project.json("cleanup", str(run_id), "--verify")
    assert report["verdict"] == "verified_clean", report


def test_a_lost_reply_adds_no_bot_twice_and_an_unreachable_server_leaves_cleanup_incomplete_until_it_is_back(
    arena: OpenArena, tmp_path: Path
) -> None:
    proxy = LossyProxy(arena.port)
    try:
        project = Project(tmp_path / "roadie", "arena", DEFINITION, f"127.0.0.1:{proxy.port}")
        before = arena.world()
        proxy.lose_reply_to(r"^addbot ", times=2)  # the first bot's and, on the retry, the second's
        (project.home / "invasion.yaml").write_text(INVASION.format(cleanup="manual", after="0s"))
        run_id = project.json("run", "start", "invasion.yaml", "--wait")["id"]
        assert project.show(run_id)["run"]["status"] == "succeeded"
        assert len(proxy.lost) == 2
        bots = arena.bots()
        assert len(bots) == len(set(bots)) == 5, bots  # no bot added twice
        assert len([c for c in proxy.seen if c.startswith("addbot ")]) == 5

        proxy.cut = True
        report = project.json("cleanup", str(run_id), exit_code=None)
        assert report["status"] == "incomplete", report
        assert report["failed"] > 0, report
        assert report["errors"], report
        assert len(arena.bots()) == 5  # nothing was taken down, and nothing pretends it was

        proxy.cut = False
        proxy.lose_request_to(r"^kick ", times=2)  # as a server past its rcon budget drops them
        report = project.json("cleanup", str(run_id), exit_code=None)
        assert (report["status"], report["verdict"]) == ("complete", "verified_clean"), report
        assert arena.world() == before
        kicks = [c for c in proxy.seen if c.startswith("kick ")]
        assert (len(kicks), len(set(kicks))) == (5 + 2, 5), kicks  # the two not done were sent again
    finally:
        proxy.close()


def test_roadie_processes_on_one_host_share_the_server_s_rcon_budget(arena: OpenArena) -> None:
    """ioquake3 answers ten rcon packets from one address at once, then one a second, and
    drops the rest unanswered. A second process sending right after a first (a `cleanup`
    after a `run start`) draws on what the first left: it waits, and loses nothing."""
    script = """
import asyncio, sys
from roadie.consoles.quake3 import Quake3Rcon
from roadie.consoles.transport import ReplyLost

async def main(port: int, count: int) -> None:
    console = Quake3Rcon("127.0.0.1", port, sys.argv[3])
    lost = 0
    for _ in range(count):
        try:
            await console.send("g_gravity")
        except ReplyLost:
            lost += 1
    print(lost)

asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
"""
    lost = []
    for count in (10, 8):
        done = subprocess.run(
            [sys.executable, "-c", script, str(arena.port), str(count), PASSWORD],
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        lost.append(int(done.stdout))
    assert lost == [0, 0]


def test_no_event_parameter_can_send_openarena_a_second_command(arena: OpenArena, tmp_path: Path) -> None:
    project = Project(tmp_path / "roadie", "arena", DEFINITION, f"127.0.0.1:{arena.port}")
    before = arena.world()
    for message in ['hi"; g_gravity 5; say "', "hi; g_gravity 5", "hi\ng_gravity 5", "hi\\"]:
        (project.home / "say.yaml").write_text(
            "id: say\ntitle: say\nphases:\n  - name: one\n    steps:\n"
            f"      - {{action: arena.broadcast, with: {{message: {json.dumps(message)}}}}}\n"
        )
        done = project.run("event", "validate", "say.yaml")
        assert done.returncode != 0, (message, done.stdout)
        assert "message" in done.stdout + done.stderr
    # A template that puts a value where the console would read a second command is
    # refused when the command is made, whatever the event's params said.
    assert arena.world() == before


def test_conformance_checks_the_openarena_module_against_the_live_server(arena: OpenArena, tmp_path: Path) -> None:
    project = Project(tmp_path / "roadie", "arena", DEFINITION, f"127.0.0.1:{arena.port}")
    before = arena.world()
    report = project.json("conformance", "--module", "arena", timeout=600)
    assert report["ok"], report
    outcomes = {r["rule"]: r["outcome"] for r in report["results"]}
    assert outcomes["action arena.bots"] == outcomes["lease arena.gravity"] == outcomes["lease arena.motd"] == "pass"
    assert outcomes["action arena.broadcast"] == "skip"  # a broadcast to every player is not sent unasked
    assert arena.world() == before
