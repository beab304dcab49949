"""Remote modules over loopback, against `roadie sandbox serve` in a process of its own.

1. Dispatch latency: one `sandbox.broadcast` dispatch at a time through the engine's remote
   client (the action the manifest built: parameters dumped, body built and signed, the
   answer judged) against the same request made with a bare httpx client (body and
   signature by hand, nothing checked). Interleaved call by call, so that drift on a shared
   machine hits both alike; median and p99 of each, and their difference.
2. Fan-out: one run of a phase of N `ledger` steps through the whole engine (SQLite) with
   the server delaying every call by D ms: wall time against the ideal `N * D / concurrency`,
   and against the same N calls made by bare httpx and httpx2 clients with nothing else.

    .venv/bin/python benchmarks/remote.py --write docs/benchmarks.md
    .venv/bin/python benchmarks/remote.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import json
import logging
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import httpx2
import structlog

sys.path.insert(0, str(Path(__file__).parent))
from report import LoadReport, parse_args, progress, write_section

from roadie.clock import SystemClock
from roadie.definitions import load_definition
from roadie.engine import Engine, EngineOptions
from roadie.registry import Call, build_registry
from roadie.remote import attach_remote_modules, protocol
from roadie.runtime import freeze_heap
from roadie.store import Store

SECRET = "benchmark-secret"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, home: Path, *flags: str) -> None:
        self.port = _free_port()
        roadie = str(Path(sys.executable).parent / "roadie")
        self.proc = subprocess.Popen(
            [roadie, "sandbox", "serve", "--port", str(self.port), "--db", str(home / "world.db"),
             "--ledger", str(home / "keys.db"), "--secret", SECRET, *flags],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                headers = protocol.sign(SECRET, "GET", protocol.MANIFEST, b"")
                if httpx.get(self.url + protocol.MANIFEST, headers=headers, timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError("sandbox serve did not start")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class Latency:
    roadie: list[float]
    bare: list[float]


async def _latency(url: str, calls: int, home: Path) -> Latency:
    modules = {"sandbox": {"url": url, "secret": SECRET}}
    clock = SystemClock()
    registry = build_registry(modules, clock=clock)
    store = await Store.open(f"sqlite:///{home / 'latency.db'}")
    await attach_remote_modules(registry, modules, store, base_dir=str(home))
    action = registry.action("sandbox.broadcast")
    bare = httpx.AsyncClient(base_url=url, timeout=10)
    roadie_s: list[float] = []
    bare_s: list[float] = []
    try:
        for i in range(calls + 50):  # the first 50 of each warm up the connections
            key = f"bench-r-{os.getpid()}-{i}"
            call = Call(
                run_id=1, step_id=i, idempotency_key=key, attempt=1,
                params=action.params.model_validate({"message": f"hello {i}"}), state=None, clock=clock,
            )  # fmt: skip
            started = time.perf_counter()
            await action.call(call)
            roadie_elapsed = time.perf_counter() - started

            bkey = f"bench-b-{os.getpid()}-{i}"
            started = time.perf_counter()
            raw = json.dumps(
                {"action": "broadcast", "run_id": 1, "step_id": i, "idempotency_key": bkey, "attempt": 1,
                 "params": {"message": f"hello {i}"}, "fence": 1}
            ).encode()  # fmt: skip
            timestamp = str(int(time.time()))
            request_id = f"msg_{os.getpid()}_{i}"
            content = f"{request_id}.{timestamp}.POST {protocol.DISPATCH}\n".encode() + raw
            digest = hmac.new(SECRET.encode(), content, hashlib.sha256).digest()
            headers = {
                protocol.H_KEY: bkey,
                protocol.H_ID: request_id,
                protocol.H_TIMESTAMP: timestamp,
                protocol.H_SIGNATURE: "v1," + base64.b64encode(digest).decode(),
                "Content-Type": "application/json",
            }
            response = await bare.post(protocol.DISPATCH, content=raw, headers=headers)
            assert response.status_code == 200, response.text
            bare_elapsed = time.perf_counter() - started
            if i >= 50:
                roadie_s.append(roadie_elapsed)
                bare_s.append(bare_elapsed)
                if len(roadie_s) % max(1, calls // 5) == 0 or len(roadie_s) == calls:
                    r50, b50 = statistics.median(roadie_s) * 1000, statistics.median(bare_s) * 1000
                    progress(
                        "remote",
                        f"latency, {len(roadie_s)}/{calls} calls: roadie median {r50:.2f} ms, bare httpx {b50:.2f} ms",
                    )
    finally:
        await bare.aclose()
        await store.close()
        await registry.close()
    return Latency(roadie_s, bare_s)


def _fan_out_event(steps: int) -> str:
    body = "\n".join(
        f"      - {{action: sandbox.spawn, name: s{i}, with: {{kind: orc, region: britain}}}}" for i in range(steps)
    )
    return f"id: fanout\ncleanup: manual\nphases:\n  - name: wave\n    steps:\n{body}\n"


async def _bare_fan_out(url: str, steps: int, concurrency: int, tag: str, client: Any = httpx) -> float:
    """The same N dispatches with no engine: a bare client (`client`: httpx, or httpx2 as the
    engine's push transport uses), `concurrency` at a time."""
    gate = asyncio.Semaphore(concurrency)
    limits = client.Limits(max_connections=concurrency)
    async with client.AsyncClient(base_url=url, timeout=30, limits=limits) as c:

        async def one(i: int) -> None:
            async with gate:
                key = f"bare-{tag}-{i}"
                raw = json.dumps(
                    {"action": "spawn", "run_id": 1, "step_id": i, "idempotency_key": key, "attempt": 1,
                     "params": {"kind": "orc", "region": "britain", "count": 1}, "fence": 1}
                ).encode()  # fmt: skip
                headers = protocol.sign(SECRET, "POST", protocol.DISPATCH, raw, key=key)
                for attempt in range(3):
                    try:
                        response = await c.post(protocol.DISPATCH, content=raw, headers=headers)
                        break
                    except client.TransportError:
                        # A connection the server dropped under load (seen once at 50 with
                        # httpx): sent again, as the engine's own dispatch would be.
                        if attempt == 2:
                            raise
                        lost.append(i)
                assert response.status_code == 200, response.text

        lost: list[int] = []
        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(steps)))
        elapsed = time.perf_counter() - started
        if lost:
            print(f"bare {client.__name__} at {concurrency}: {len(lost)} calls sent again", file=sys.stderr)
        return elapsed


async def _fan_out(url: str, steps: int, concurrency: int, home: Path, tag: str) -> float:
    modules = {"sandbox": {"url": url, "secret": SECRET, "max_connections": concurrency}}
    clock = SystemClock()
    registry = build_registry(modules, clock=clock)
    store = await Store.open(f"sqlite:///{home / f'fanout-{tag}.db'}")
    await attach_remote_modules(registry, modules, store, base_dir=str(home))
    engine = Engine(store, registry, clock=clock, options=EngineOptions(concurrency=concurrency, poll_interval=0.01))
    try:
        text = _fan_out_event(steps)
        definition = load_definition(text, "fanout.yaml", registry)
        event = await store.create_event_version(
            definition.id, definition.title, definition.model_dump(mode="json", by_alias=True), text, "bench",
            clock.now(),
        )  # fmt: skip
        run = await engine.start_run(event, {})
        started = time.perf_counter()
        [done] = await engine.settle([run.id], max_ticks=100_000)
        elapsed = time.perf_counter() - started
        assert done.status == "succeeded", done.error
        return elapsed
    finally:
        await store.close()
        await registry.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=1000, help="timed dispatches of each kind")
    parser.add_argument("--steps", type=int, default=1000, help="steps in the fan-out phase")
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[5, 10, 25, 50])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--write", type=Path)
    args = parse_args(parser, argv, quick={"calls": 100, "steps": 100, "concurrency": [10, 50], "repeats": 1})
    load = LoadReport("remote")
    freeze_heap()  # as `roadie worker` does once it has started: this process stands in for one
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    home = Path(tempfile.mkdtemp(prefix="roadie-remote-"))

    (home / "lat").mkdir()
    server = Server(home / "lat")
    try:
        latency = asyncio.run(_latency(server.url, args.calls, home / "lat"))
    finally:
        server.stop()

    fan_rows: list[tuple[int, list[float], list[float], list[float]]] = []
    for concurrency in args.concurrency:
        runs: list[float] = []
        bare_runs: list[float] = []
        bare2_runs: list[float] = []
        for r in range(args.repeats):
            where = home / f"fan-{concurrency}-{r}"
            where.mkdir()
            server = Server(where, "--delay", f"{args.delay_ms:g}ms")
            try:
                tag = f"{concurrency}-{r}"
                bare_runs.append(asyncio.run(_bare_fan_out(server.url, args.steps, concurrency, tag)))
                bare2_runs.append(asyncio.run(_bare_fan_out(server.url, args.steps, concurrency, f"2-{tag}", httpx2)))
                runs.append(asyncio.run(_fan_out(server.url, args.steps, concurrency, where, tag)))
            finally:
                server.stop()
            progress(
                "remote",
                f"fan-out, concurrency {concurrency}, repeat {r + 1}/{args.repeats}: roadie {runs[-1]:.2f} s, "
                f"bare httpx {bare_runs[-1]:.2f} s, bare httpx2 {bare2_runs[-1]:.2f} s "
                f"(ideal {args.steps * args.delay_ms / 1000 / concurrency:.2f} s)",
            )
        fan_rows.append((concurrency, runs, bare_runs, bare2_runs))

    section = _section(latency, fan_rows, args, load.end())
    print(section)
    if args.write:
        write_section(args.write, "remote.py", section)
    return 0


def _section(
    latency: Latency,
    fan_rows: list[tuple[int, list[float], list[float], list[float]]],
    args: argparse.Namespace,
    load: str,
) -> str:
    ms = 1000.0
    r50, r99 = statistics.median(latency.roadie) * ms, _pct(latency.roadie, 0.99) * ms
    b50, b99 = statistics.median(latency.bare) * ms, _pct(latency.bare, 0.99) * ms
    lines = [
        "## Remote modules over loopback",
        "",
        "Against `roadie sandbox serve` (the plugin SDK serving the sandbox world, with its key ledger) in a "
        "process of its own on 127.0.0.1.",
        f"Machine: {platform.machine()}, {platform.python_implementation()} {platform.python_version()}, "
        f"{platform.system()}, {os.cpu_count()} cores shared by client and server.",
        "",
        load,
        "",
        f"Command: `.venv/bin/python benchmarks/remote.py --write docs/benchmarks.md` (calls={args.calls}, "
        f"steps={args.steps}, delay={args.delay_ms:g} ms, repeats={args.repeats})",
        "",
        "### Dispatch latency",
        "",
        "One `sandbox.broadcast` dispatch at a time, a fresh key each, interleaved call by call: through the "
        "engine's remote client, and as a bare httpx POST of the same signed body.",
        "",
        "| path | median ms | p99 ms |",
        "| --- | ---: | ---: |",
        f"| Roadie remote client | {r50:.3f} | {r99:.3f} |",
        f"| bare httpx | {b50:.3f} | {b99:.3f} |",
        f"| overhead | {r50 - b50:+.3f} ({r50 / b50:.2f}×) | {r99 - b99:+.3f} ({r99 / b99:.2f}×) |",
        "",
        "### Fan-out",
        "",
        f"One run, one phase of {args.steps} `sandbox.spawn` steps (ledgered: placeholder reserved before each "
        f"dispatch, answer recorded after), the server delaying every call by {args.delay_ms:g} ms; wall time "
        "from the run's start to its end, SQLite. Ideal = steps × delay / concurrency. Beside it, on the same "
        "server just before, the same number of dispatches made by a bare client `concurrency` at a time "
        "(no engine, no ledger): httpx, and httpx2, on which the engine's push transport is built.",
        "",
        "| concurrency | ideal s | bare httpx s | bare httpx2 s | Roadie s median | min–max | Roadie / ideal "
        "| Roadie / bare httpx | Roadie / bare httpx2 |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for concurrency, runs, bare_runs, bare2_runs in fan_rows:
        ideal = args.steps * args.delay_ms / 1000 / concurrency
        median, bare, bare2 = statistics.median(runs), statistics.median(bare_runs), statistics.median(bare2_runs)
        lines.append(
            f"| {concurrency} | {ideal:.3f} | {bare:.3f} | {bare2:.3f} | {median:.3f} "
            f"| {min(runs):.3f}–{max(runs):.3f} | {median / ideal:.2f} | {median / bare:.2f} | {median / bare2:.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
