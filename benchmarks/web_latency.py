"""Latency of `roadie serve` under 50 concurrent clients: `GET /api/v1/runs/{id}` and the
run page, against a real uvicorn process over loopback.

The database (SQLite) holds one finished run of the demo invasion (10 steps, 18 ledger
rows), worked in-process beforehand; the server runs with `--no-worker`, so what is
measured is the web layer and its reads. Each of the 50 clients is an `httpx.AsyncClient`
with its own connection, sending its requests one after another; the clients share one
process (and the machine's cores with the server), so the figures are an upper bound on
what a browser would see.

    .venv/bin/python benchmarks/web_latency.py --write docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
from report import write_section

from roadie.clock import FakeClock
from roadie.definitions import load_file
from roadie.engine import Engine
from roadie.registry import build_registry
from roadie.store import Store
from roadie.web import tokens
from roadie.web.auth import COOKIE

INVASION = Path(__file__).resolve().parents[1] / "src/roadie/examples/invasion.yaml"


async def prepare(home: Path, url: str) -> tuple[int, str]:
    """One settled run of the invasion, and an operator token."""
    clock = FakeClock()
    registry = build_registry({"sandbox": {"db": str(home / "sandbox.db")}}, clock=clock)
    store = await Store.open(url)
    try:
        engine = Engine(store, registry, clock=clock)
        definition = load_file(INVASION, registry)
        event = await store.create_event_version(
            definition.id, definition.title, definition.model_dump(mode="json", by_alias=True), "", "bench", clock.now()
        )
        run = await engine.start_run(event, {})
        await engine.settle([run.id])
        minted = tokens.mint()
        await store.create_token(
            key=minted.key,
            name="bench",
            role="operator",
            secret_hash=minted.secret_hash,
            actor="bench",
            now=datetime.now(UTC),
        )
        return run.id, minted.token
    finally:
        await store.close()
        await registry.close()


async def measure(
    base: str, path: str, headers: dict[str, str], cookies: dict[str, str], clients: int, each: int
) -> list[float]:
    latencies: list[float] = []

    async def client() -> None:
        async with httpx.AsyncClient(base_url=base, headers=headers, cookies=cookies, timeout=30) as http:
            await http.get(path)  # connect and warm up
            for _ in range(each):
                started = time.perf_counter()
                response = await http.get(path)
                latencies.append(time.perf_counter() - started)
                response.raise_for_status()

    await asyncio.gather(*(client() for _ in range(clients)))
    return latencies


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--requests", type=int, default=40, help="requests per client per endpoint")
    parser.add_argument("--write", type=Path, help="write the results as Markdown to this file")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        url = f"sqlite:///{home / 'roadie.db'}"
        run_id, token = asyncio.run(prepare(home, url))
        (home / "roadie.toml").write_text('[modules.sandbox]\ndb = "sandbox.db"\n')
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**os.environ, "ROADIE_DATABASE_URL": url}
        server = subprocess.Popen(
            [sys.executable, "-m", "roadie.cli.main", "serve", "--no-worker", "--port", str(port)],
            cwd=home,
            env=env,
            stderr=subprocess.DEVNULL,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            for _ in range(200):
                try:
                    if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.05)
            with httpx.Client(base_url=base) as browser:  # the sign-in form, then its post, as a browser
                form = re.search(r'name="csrf" value="([^"]+)"', browser.get("/login").text)
                assert form is not None
                browser.post("/login", data={"token": token, "csrf": form.group(1)})
                cookies = {COOKIE: browser.cookies[COOKIE]}
            rows = []
            for label, path, headers, jar in (
                (
                    "`GET /api/v1/runs/{id}` (JSON)",
                    f"/api/v1/runs/{run_id}",
                    {"Authorization": f"Bearer {token}"},
                    {},
                ),
                ("`GET /runs/{id}` (run page, HTML + SVG)", f"/runs/{run_id}", {}, cookies),
            ):
                started = time.perf_counter()
                latencies = asyncio.run(measure(base, path, headers, jar, args.clients, args.requests))
                elapsed = time.perf_counter() - started
                p50, p99 = percentile(latencies, 50) * 1000, percentile(latencies, 99) * 1000
                rate = len(latencies) / elapsed
                rows.append((label, len(latencies), p50, p99, statistics.mean(latencies) * 1000, rate))
                print(f"{label:<44} n={len(latencies)} p50 {p50:.1f} ms  p99 {p99:.1f} ms  {rate:.0f} req/s")
        finally:
            server.terminate()
            server.wait(timeout=30)
    if args.write:
        lines = [
            "## The web: latency under 50 concurrent clients",
            "",
            f"`roadie serve --no-worker` (uvicorn, one process) on SQLite holding one finished run of the demo "
            f"invasion; {args.clients} concurrent `httpx` clients over loopback, each sending {args.requests} "
            "requests one after another (after one warm-up request), in one client process on the same machine. "
            f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.python_implementation()} "
            f"{platform.python_version()}, {platform.system()}.",
            "",
            f"Command: `.venv/bin/python benchmarks/web_latency.py --write {args.write}`",
            "",
            "| request | requests | p50 ms | p99 ms | mean ms | requests/s |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for label, n, p50, p99, mean, rate in rows:
            lines.append(f"| {label} | {n} | {p50:.1f} | {p99:.1f} | {mean:.1f} | {rate:.0f} |")
        write_section(args.write, "web_latency.py", "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
