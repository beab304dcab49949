"""The engine against `roadie sandbox serve` in a process of its own, over loopback, in push
and in pull mode: answers lost (20 %), failures retried, the module server killed -9 in the
middle of a phase and restarted — and after cleanup the world is exactly as it was, every
effect having happened once. Then a world that rolls back after cleanup, and `--verify`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from roadie.clock import SystemClock
from roadie.definitions import load_definition
from roadie.engine import Engine, EngineOptions
from roadie.modules.sandbox import open_world
from roadie.registry import build_registry
from roadie.remote import attach_remote_modules, refresh_pull_module
from roadie.remote.gateway import Gateway, Server
from roadie.store import Store
from roadie.store.rows import EventRow, RunRow
from tests.remote.servers import SECRET, SandboxServer, free_port

SPAWNS = 24
PLACES = 8


def event_text(event_id: str = "remote-invasion") -> str:
    retry = "retry: {attempts: 15, backoff: 100ms, max_backoff: 1s}"
    steps = [
        f"      - {{action: sandbox.spawn, name: orcs{i}, with: {{kind: orc, region: britain, count: 2}}, {retry}}}"
        for i in range(SPAWNS)
    ] + [
        f"      - {{action: sandbox.place_item, name: chest{i}, with: {{kind: chest, region: moonglow}}, {retry}}}"
        for i in range(PLACES)
    ]
    return f"""
id: {event_id}
cleanup: auto
phases:
  - name: omens
    steps:
      - {{action: core.lease, name: storm, with: {{lease: sandbox.weather, target: britain, value: storm}}, {retry}}}
      - {{action: core.lease, name: xp, with: {{lease: sandbox.xp_rate, value: 2.0}}, {retry}}}
  - name: wave
    steps:
{chr(10).join(steps)}
"""


@dataclass
class Remote:
    store: Store
    engine: Engine
    server: SandboxServer


@contextlib.asynccontextmanager
async def remote_engine(
    tmp_path: Path, server: SandboxServer, *, pull: bool, gateway_port: int
) -> AsyncIterator[Remote]:
    table: dict[str, Any] = {"transport": "pull", "secret": SECRET} if pull else {"url": server.url, "secret": SECRET}
    modules = {"sandbox": table}
    clock = SystemClock()
    if not pull:
        server.start()  # its manifest is fetched when the module is attached
    registry = build_registry(modules, clock=clock)
    store = await Store.open(f"sqlite:///{tmp_path / 'roadie.db'}")
    remotes = await attach_remote_modules(registry, modules, store, base_dir=str(tmp_path))
    remotes.queue.visibility = 2.0  # a pulled call the killed server never answered comes back soon
    engine = Engine(store, registry, clock=clock, options=EngineOptions(concurrency=16, poll_interval=0.05, seed=7))
    gateway_server: Server | None = None
    gateway_task: asyncio.Task[None] | None = None
    if pull:
        gateway = Gateway(
            store,
            remotes.queue,
            remotes.secrets,
            registry,
            on_announce=lambda m: refresh_pull_module(registry, remotes, m, str(tmp_path)),
        )
        config = uvicorn.Config(gateway.app(), host="127.0.0.1", port=gateway_port, log_level="warning")
        gateway_server = Server(config, lambda: remotes.queue)
        gateway_task = asyncio.create_task(gateway_server.serve())
        while not gateway_server.started:
            await asyncio.sleep(0.02)
    if pull:
        server.start()
        deadline = time.monotonic() + 20
        while not registry.module("sandbox").actions:
            assert time.monotonic() < deadline, f"the pulling server never announced itself:\n{server.log.read_text()}"
            await asyncio.sleep(0.05)
    try:
        yield Remote(store, engine, server)
    finally:
        server.stop()
        if gateway_server is not None and gateway_task is not None:
            gateway_server.should_exit = True
            await gateway_task
        await store.close()
        await registry.close()


async def wait_for(check: Any, seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def apply_event(remote: Remote, text: str) -> EventRow:
    """Store `text` as its event's newest version, checked against the remote module."""
    definition = load_definition(text, "event.yaml", remote.engine.registry)
    dumped = definition.model_dump(mode="json", by_alias=True)
    now = remote.engine.clock.now()
    return await remote.store.create_event_version(definition.id, definition.title, dumped, text, "test", now)


async def carry_out_with_a_kill(remote: Remote) -> RunRow:
    """Start the run, kill -9 the server once part of the wave has answered, restart it,
    and wait for the run to end and be cleaned up."""
    store, engine = remote.store, remote.engine
    event = await apply_event(remote, event_text())
    worker = asyncio.create_task(engine.run_forever())
    try:
        run = await engine.start_run(event, {})

        async def some_of_the_wave_answered() -> bool:
            done = [s for s in await store.list_steps(run.id) if s.phase == 1 and s.status == "succeeded"]
            return len(done) >= 4

        await wait_for(some_of_the_wave_answered, 60, "the wave to begin")
        remote.server.kill()
        await asyncio.sleep(0.5)
        remote.server.start()

        async def ended_and_cleaned() -> RunRow | None:
            current = await store.get_run(run.id)
            return current if current.cleanup_status in ("complete", "incomplete") else None

        return await wait_for(ended_and_cleaned, 120, "the run to end and be cleaned up")
    finally:
        engine.stop()
        await worker


def assert_every_effect_once(world_path: Path) -> None:
    world = open_world(str(world_path), SystemClock())
    try:
        effects = world.effects()
    finally:
        world.close()
    made = Counter((e["key"], e["kind"], e["idx"]) for e in effects if e["op"] == "create")
    assert made
    assert max(made.values()) == 1, [k for k, n in made.items() if n > 1]
    removed = Counter(e["ref"] for e in effects if e["op"] == "remove")
    assert not removed or max(removed.values()) == 1
    created_refs = {e["ref"] for e in effects if e["op"] == "create"}
    assert created_refs == set(removed), "everything made was removed, once"
    assert len(created_refs) == SPAWNS * 2 + PLACES


def world_state(path: Path) -> dict[str, Any]:
    world = open_world(str(path), SystemClock())
    try:
        return world.snapshot()
    finally:
        world.close()


def append_figures(figures: dict[str, Any]) -> None:
    """With ROADIE_CHAOS_REPORT=FILE, a trial's figures as one JSON line (docs/reliability.md)."""
    path = os.environ.get("ROADIE_CHAOS_REPORT")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps(figures) + "\n")


TRIALS = int(os.environ.get("ROADIE_REMOTE_TRIALS", "1"))  # more for docs/reliability.md's figures


@pytest.mark.parametrize("trial", range(TRIALS))
@pytest.mark.parametrize("pull", [False, True], ids=["push", "pull"])
def test_a_run_over_the_network_is_exact_through_faults_and_a_kill(tmp_path: Path, pull: bool, trial: int) -> None:
    gateway_port = free_port()
    server = SandboxServer(
        tmp_path,
        "--lose-answers", "0.2", "--fail-first", "2", "--seed", str(3 + trial),
        pull=f"http://127.0.0.1:{gateway_port}" if pull else None,
    )  # fmt: skip

    async def body() -> None:
        async with remote_engine(tmp_path, server, pull=pull, gateway_port=gateway_port) as remote:
            before = world_state(server.world)
            run = await carry_out_with_a_kill(remote)
            assert run.status == "succeeded", run.error
            assert run.cleanup_status == "complete", run.cleanup_report
            steps = await remote.store.list_steps(run.id)
            retried = [s for s in steps if s.attempts > 1]
            assert retried, "lost answers and failures were retried"
            assert world_state(server.world) == before
            dropped = server.answers_dropped()
            assert dropped > 0, "the server lost no answers: the test tested nothing"
        assert_every_effect_once(server.world)
        append_figures(
            {
                "suite": "remote",
                "transport": "pull" if pull else "push",
                "steps": len(steps),
                "retried": len(retried),
                "attempts": sum(s.attempts for s in steps),
                "answers_lost": dropped,
                "server_kills": 1,
                "restored": True,
            }
        )

    asyncio.run(body())


@pytest.mark.parametrize("pull", [False, True], ids=["push", "pull"])
def test_a_rolled_back_server_is_found_and_taken_down_again(tmp_path: Path, pull: bool) -> None:
    """The server's world file is put back as it was just before cleanup (a game server
    that crashed before saving its removals): the next cleanup round reads the world back
    over the protocol, finds every creature and setting that came back, says *partially
    rolled back* and reverts them again; the object a reused serial now names is left
    alone; the round after says *verified clean*."""
    gateway_port = free_port()
    server = SandboxServer(tmp_path, pull=f"http://127.0.0.1:{gateway_port}" if pull else None)

    async def body() -> None:
        async with remote_engine(tmp_path, server, pull=pull, gateway_port=gateway_port) as remote:
            engine = remote.engine
            before = world_state(server.world)
            text = event_text("verify").replace("cleanup: auto", "cleanup: manual")
            event = await apply_event(remote, text)
            run = await engine.start_run(event, {})
            [run] = await engine.settle([run.id])
            assert run.status == "succeeded"
            server.stop()
            for name in ("world.db", "world.db-wal", "world.db-shm"):
                if (tmp_path / name).exists():
                    shutil.copy(tmp_path / name, tmp_path / f"saved-{name}")
            server.start()
            report = await engine.clean_up(run.id)
            assert (report.status, report.verdict) == ("complete", "verified_clean")
            assert world_state(server.world) == before

            server.stop()  # the crash, and the restart from the last save
            for name in ("world.db", "world.db-wal", "world.db-shm"):
                (tmp_path / name).unlink(missing_ok=True)
                if (tmp_path / f"saved-{name}").exists():
                    shutil.copy(tmp_path / f"saved-{name}", tmp_path / name)
            back = world_state(server.world)
            assert len(back["creatures"]) == SPAWNS * 2
            reused = sorted(back["creatures"])[0]
            world = open_world(str(server.world), SystemClock())
            world.reuse_serial(reused, "horse", "britain", tag="another-key")
            world.close()
            server.start()

            again = await engine.clean_up(run.id, again=True)
            assert (again.status, again.verdict) == ("rolled_back", "partially_rolled_back")
            leases = 2
            assert again.verification["came_back"] == SPAWNS * 2 + PLACES - 1 + leases
            assert (again.reverted, again.restored) == (SPAWNS * 2 + PLACES - 1, leases)
            assert again.verification["foreign"] == 1
            after = world_state(server.world)
            assert after["creatures"] == {reused: {"kind": "horse", "region": "britain"}}
            assert {k: v for k, v in after.items() if k != "creatures"} == {
                k: v for k, v in before.items() if k != "creatures"
            }
            proof = await engine.clean_up(run.id)
            assert (proof.status, proof.verdict, proof.calls) == ("complete", "verified_clean", 0)

    asyncio.run(body())


def test_a_manifest_shapes_validation(tmp_path: Path) -> None:
    """The server's schemas check an event's parameters when it is validated."""
    server = SandboxServer(tmp_path)

    async def body() -> None:
        async with remote_engine(tmp_path, server, pull=False, gateway_port=0) as remote:
            bad = event_text("bad").replace("count: 2", "count: 5000", 1)
            with pytest.raises(Exception, match=r"count: 5000 is greater than the maximum of 500"):
                load_definition(bad, "bad.yaml", remote.engine.registry)
            assert (tmp_path / ".roadie" / "manifests" / "sandbox.json").exists()

    asyncio.run(body())


@pytest.mark.parametrize("pull", [False, True], ids=["push", "pull"])
def test_summons_are_swept_over_the_protocol(tmp_path: Path, pull: bool) -> None:
    """A warlord spawned by a run summons two minions in the server's world, which no one
    reports; after the run's cleanup the sweep lists them over `tagged` and reverts them
    under the warlord's key, push and pull alike."""
    gateway_port = free_port()
    server = SandboxServer(tmp_path, pull=f"http://127.0.0.1:{gateway_port}" if pull else None)
    text = """
id: warlord
cleanup: manual
phases:
  - name: only
    steps:
      - {action: sandbox.spawn, name: warlord, with: {kind: orc warlord, region: britain}}
"""

    async def body() -> None:
        async with remote_engine(tmp_path, server, pull=pull, gateway_port=gateway_port) as remote:
            engine = remote.engine
            assert engine.registry.module("sandbox").tagged_fn is not None  # the manifest says tagged
            before = world_state(server.world)
            event = await apply_event(remote, text)
            run = await engine.start_run(event, {})
            [run] = await engine.settle([run.id])
            [warlord] = world_state(server.world)["creatures"]
            world = open_world(str(server.world), SystemClock())
            minions = world.summon(warlord, "orc minion", 2)
            world.close()
            assert (await engine.clean_up(run.id)).status == "complete"
            assert sorted(world_state(server.world)["creatures"]) == sorted(minions)

            [swept] = await engine.sweeper.sweep(actor="test")
            assert (swept.orphans, swept.reverted, swept.failed, swept.errors) == (2, 2, 0, [])
            assert world_state(server.world) == before

    asyncio.run(body())


@pytest.mark.parametrize("pull", [False, True], ids=["push", "pull"])
def test_a_lease_that_stacks_is_layered_over_the_protocol(tmp_path: Path, pull: bool) -> None:
    """The server's manifest says `sandbox.motd` stacks: two runs each hold a layer of it,
    the world shows the higher one, and each run's cleanup pops its own layer."""
    gateway_port = free_port()
    server = SandboxServer(tmp_path, pull=f"http://127.0.0.1:{gateway_port}" if pull else None)

    def banner(event_id: str, text: str, priority: int) -> str:
        return (
            f"id: {event_id}\ncleanup: manual\nphases:\n  - name: only\n    steps:\n      - action: core.lease\n"
            f"        name: banner\n        with: {{lease: sandbox.motd, value: {text}, priority: {priority}}}\n"
        )

    async def body() -> None:
        async with remote_engine(tmp_path, server, pull=pull, gateway_port=gateway_port) as remote:
            engine = remote.engine
            assert engine.registry.lease("sandbox.motd").stacks

            def motd() -> Any:
                return world_state(server.world)["settings"]["motd"]

            runs = []
            for event_id, text, priority in (("low", "fishing", 1), ("high", "invasion", 9)):
                event = await apply_event(remote, banner(event_id, text, priority))
                [run] = await engine.settle([(await engine.start_run(event, {})).id])
                assert run.status == "succeeded", run.error
                runs.append(run.id)
            assert motd() == "invasion"
            assert (await engine.clean_up(runs[1])).verdict == "verified_clean"
            assert motd() == "fishing"
            assert (await engine.clean_up(runs[0])).verdict == "verified_clean"
            assert motd() == ""

    asyncio.run(body())


@pytest.mark.parametrize("pull", [False, True], ids=["push", "pull"])
def test_a_run_that_ended_while_no_worker_was_alive_is_held_at_its_cap_over_the_protocol(
    tmp_path: Path, pull: bool
) -> None:
    """Every worker is down when the run's duration ends: the first one back ends the run
    and comes to its cleanup before anything else, where a cap of 2 on the sandbox holds
    the teardown of 3 orcs for a person; the confirmation takes them down, proved."""
    gateway_port = free_port()
    server = SandboxServer(tmp_path, pull=f"http://127.0.0.1:{gateway_port}" if pull else None)
    text = (
        "id: downtime\nduration: 1s\ncleanup: auto\nphases:\n  - name: raid\n    steps:\n"
        "      - {action: sandbox.spawn, name: orcs, with: {kind: orc, region: yew, count: 3}}\n"
    )

    async def body() -> None:
        async with remote_engine(tmp_path, server, pull=pull, gateway_port=gateway_port) as remote:
            store, engine = remote.store, remote.engine
            engine.cleanup.caps = {"sandbox": 2}  # [engine.cleanup_caps] sandbox = 2
            before = world_state(server.world)
            event = await apply_event(remote, text)
            run = await engine.start_run(event, {})

            async def spawned() -> bool:
                await engine.tick()  # materialise, claim and dispatch: the drain awaits its answers
                return any(s.status == "succeeded" for s in await store.list_steps(run.id))

            await wait_for(spawned, 30, "the orcs to be spawned")
            assert len(world_state(server.world)["creatures"]) == 3
            # No worker is alive: the run's end passes unseen.
            current = await store.get_run(run.id)
            assert current.status == "running"
            assert current.ends_at is not None
            ends_at = current.ends_at

            async def past_the_end() -> bool:
                return engine.clock.now() > ends_at

            await wait_for(past_the_end, 10, "the run's end to pass")
            await engine.catch_up()  # the first worker back
            held = await store.get_run(run.id)
            assert (held.status, held.cleanup_status) == ("succeeded", "held")
            assert len(world_state(server.world)["creatures"]) == 3  # not taken down blind
            report = await engine.clean_up(run.id, again=True, confirm=True)  # as `roadie cleanup 1 --confirm`
            assert (report.status, report.verdict, report.reverted) == ("complete", "verified_clean", 3)
            assert world_state(server.world) == before

    asyncio.run(body())
