"""`roadie gateway` in a process of its own: a pulling module announces itself, takes a
call a run's step made, answers it, and the run ends with what it answered."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from roadie import protocol
from roadie.modules import sandbox
from roadie.plugin import PullClient
from roadie.store import Store
from tests.remote.servers import free_port

SECRET = "gateway-acceptance-secret"
EVENT = """
id: pulled
cleanup: manual
phases:
  - name: only
    steps:
      - {action: sandbox.spawn, name: orcs, with: {kind: orc, region: britain, count: 2}}
"""


def _configured(home: Path) -> tuple[dict[str, str], str]:
    """A project whose sandbox module pulls: its environment, and the `roadie` command."""
    (home / "roadie.toml").write_text(
        f'database_url = "sqlite:///{home / "roadie.db"}"\n\n'
        '[engine]\npoll_interval = 0.05\n\n[modules.sandbox]\ntransport = "pull"\nsecret_env = "SANDBOX_SECRET"\n'
    )
    return {**os.environ, "SANDBOX_SECRET": SECRET}, str(Path(sys.executable).parent / "roadie")


def test_roadie_gateway_serves_a_pulling_module(tmp_path: Path) -> None:
    port = free_port()
    env, roadie = _configured(tmp_path)
    gateway = subprocess.Popen(
        [roadie, "gateway", "--port", str(port), "--visibility", "2"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                refused = httpx.post(url + protocol.PULL, json={"max": 1, "wait": 0}, timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the gateway never listened"
                time.sleep(0.1)
        assert refused.status_code == 401

        async def run_it() -> str:
            client = PullClient(  # the sandbox world, polling the gateway from this process
                sandbox.module, url, SECRET, str(tmp_path / "keys.db"), settings={"db": "world.db"},
                base_dir=str(tmp_path), wait=60.0,
            )  # fmt: skip
            polling = asyncio.create_task(client.run())
            await asyncio.wait_for(client.announced.wait(), 20)
            (tmp_path / "pulled.yaml").write_text(EVENT)
            started = await asyncio.to_thread(
                subprocess.run,
                [roadie, "run", "start", "pulled.yaml", "--json"],
                cwd=tmp_path, env=env, capture_output=True, text=True, check=False,
            )  # fmt: skip
            assert started.returncode == 0, started.stdout + started.stderr
            store = await Store.open(f"sqlite:///{tmp_path / 'roadie.db'}")
            try:
                for _ in range(400):
                    [run] = await store.list_runs()
                    if run.status not in ("pending", "running"):
                        break
                    await asyncio.sleep(0.05)
                resources = await store.list_resources(run.id)
                creatures = client.server.state.snapshot()["creatures"]
                # Stopped while the module's poll is held open (for up to 60 s): the poll
                # is answered at once, and the gateway does not wait it out.
                gateway.terminate()
                await asyncio.to_thread(gateway.wait, 30)
            finally:
                await store.close()
                client.stop()
                await polling
            assert sorted(r.kind for r in resources if r.kind != "@step") == ["creature", "creature"]
            assert len(creatures) == 2
            return run.status

        assert asyncio.run(run_it()) == "succeeded"
    finally:
        gateway.terminate()
        out, _ = gateway.communicate(timeout=30)
        assert gateway.returncode == 0, out.decode()[-2000:]


def test_a_stopped_gateway_serves_its_worker_s_calls_until_the_worker_has_stopped(tmp_path: Path) -> None:
    """SIGTERM while the embedded worker waits on a call queued for a pulling module: the
    gateway stops its worker first and serves on, so the module can still take the call
    and answer it, and the run's step ends with the answer. Before, the gateway stopped
    serving first: the module found nobody to poll, and the worker waited out the call's
    whole deadline for an answer that could not come (a Luanti cleanup round held a
    SIGTERM up for seven minutes)."""
    port = free_port()
    env, roadie = _configured(tmp_path)
    gateway = subprocess.Popen(
        [roadie, "gateway", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def client() -> PullClient:
        return PullClient(
            sandbox.module, url, SECRET, str(tmp_path / "keys.db"), settings={"db": "world.db"},
            base_dir=str(tmp_path), wait=5.0,
        )  # fmt: skip

    async def run_it() -> tuple[str, int]:
        first = client()  # announces, then goes away before the run starts
        polling = asyncio.create_task(first.run())
        await asyncio.wait_for(first.announced.wait(), 30)
        first.stop()
        await polling
        (tmp_path / "pulled.yaml").write_text(EVENT)
        started = await asyncio.to_thread(
            subprocess.run, [roadie, "run", "start", "pulled.yaml", "--json"],
            cwd=tmp_path, env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert started.returncode == 0, started.stdout + started.stderr
        store = await Store.open(f"sqlite:///{tmp_path / 'roadie.db'}")
        try:
            for _ in range(600):  # until the worker has the step (its call is queued)
                [run] = await store.list_runs()
                if [s.status for s in await store.list_steps(run.id)] == ["running"]:
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the worker never took the step")
            gateway.terminate()
            second = client()  # the module is back after the SIGTERM, and polls
            polling = asyncio.create_task(second.run())
            try:
                code = await asyncio.to_thread(gateway.wait, 60)
            finally:
                second.stop()
                await polling
            [step] = await store.list_steps(run.id)
            return step.status, code
        finally:
            await store.close()

    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(url + "/healthz", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the gateway never listened"
                time.sleep(0.1)
        assert asyncio.run(run_it()) == ("succeeded", 0)
    finally:
        gateway.kill()
        out, _ = gateway.communicate(timeout=30)
    assert "gateway stopped" in out.decode(), out.decode()[-2000:]
