"""Latency of `roadie serve` under 50 concurrent clients: `GET /api/v1/runs/{id}` and the
run page, against a real uvicorn process over loopback, side by side with its floor: a
bare FastAPI app on the same stack and database file reading the same run with one query
(`benchmarks/bare_app.py`). The three are measured in turn, `--rounds` times, and each
figure is the median over the rounds; the ratios to the floor are what count.

The database (SQLite) holds one finished run of the demo invasion (10 steps, 18 ledger
rows), worked in-process beforehand; the server runs with `--no-worker`, so what is
measured is the web layer and its reads. Each of the 50 clients is an `httpx.AsyncClient`
with its own connection, sending its requests one after another; the clients share one
process (and the machine's cores with the server), so the figures are an upper bound on
what a browser would see.

    .venv/bin/python benchmarks/web_latency.py --write docs/benchmarks.md
    .venv/bin/python benchmarks/web_latency.py --quick
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
from report import LoadReport, parse_args, progress, write_section

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(argv: list[str], cwd: Path, env: dict[str, str], ready: str) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    server = subprocess.Popen([*argv, "--port", str(port)], cwd=cwd, env=env, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(400):
        try:
            if httpx.get(base + ready, timeout=1).status_code < 500:
                return server, base
        except httpx.TransportError:
            time.sleep(0.05)
    server.kill()
    raise RuntimeError(f"{argv} did not answer on {base}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--requests", type=int, default=40, help="requests per client per endpoint and round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three, interleaved")
    parser.add_argument("--write", type=Path, help="write the results as Markdown to this file")
    args = parse_args(parser, argv, quick={"clients": 10, "requests": 10, "rounds": 1})
    load = LoadReport("web_latency")

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        url = f"sqlite:///{home / 'roadie.db'}"
        run_id, token = asyncio.run(prepare(home, url))
        (home / "roadie.toml").write_text('[modules.sandbox]\ndb = "sandbox.db"\n')
        env = {**os.environ, "ROADIE_DATABASE_URL": url, "ROADIE_BENCH_DB": str(home / "roadie.db")}
        roadie, base = _serve([sys.executable, "-m", "roadie.cli.main", "serve", "--no-worker"], home, env, "/healthz")
        bare_argv = [sys.executable, "-m", "uvicorn", "--app-dir", str(Path(__file__).parent), "bare_app:app"]
        bare, bare_base = _serve([*bare_argv, "--log-level", "warning"], home, env, f"/runs/{run_id}")
        try:
            with httpx.Client(base_url=base) as browser:  # the sign-in form, then its post, as a browser
                form = re.search(r'name="csrf" value="([^"]+)"', browser.get("/login").text)
                assert form is not None
                browser.post("/login", data={"token": token, "csrf": form.group(1)})
                cookies = {COOKIE: browser.cookies[COOKIE]}
            bearer = {"Authorization": f"Bearer {token}"}
            targets = [
                ("bare FastAPI, one query (the floor)", bare_base, f"/runs/{run_id}", {}, {}),
                (
                    "`GET /api/v1/runs/{id}` (JSON)",
                    base,
                    f"/api/v1/runs/{run_id}",
                    bearer,
                    {},
                ),
                ("`GET /runs/{id}` (run page, HTML + SVG)", base, f"/runs/{run_id}", {}, cookies),
            ]
            figures: dict[str, list[tuple[float, float, float, float]]] = {t[0]: [] for t in targets}
            for i in range(args.rounds):
                for label, at, path, headers, jar in targets:
                    started = time.perf_counter()
                    latencies = asyncio.run(measure(at, path, headers, jar, args.clients, args.requests))
                    elapsed = time.perf_counter() - started
                    figures[label].append(
                        (
                            percentile(latencies, 50) * 1000,
                            percentile(latencies, 99) * 1000,
                            statistics.mean(latencies) * 1000,
                            len(latencies) / elapsed,
                        )
                    )
                    p50, p99, _, rate = figures[label][-1]
                    progress(
                        "web_latency",
                        f"round {i + 1}/{args.rounds}, {label}: p50 {p50:.1f} ms, p99 {p99:.1f} ms, {rate:.0f} req/s",
                    )
        finally:
            for server in (roadie, bare):
                server.terminate()
                server.wait(timeout=30)
    rows = []
    floor = [statistics.median(f[i] for f in figures[targets[0][0]]) for i in range(4)]
    for label, *_ in targets:
        p50, p99, mean, rate = (statistics.median(f[i] for f in figures[label]) for i in range(4))
        rows.append((label, p50, p99, mean, rate, p50 / floor[0], p99 / floor[1]))
        ratios = f"({p50 / floor[0]:.2f}x, p99 {p99:.1f} ms, {p99 / floor[1]:.2f}x)"
        print(f"{label:<44} p50 {p50:.1f} ms {ratios}  {rate:.0f} req/s")
    load_line = load.end()
    print(load_line)
    if args.write:
        lines = [
            "## The web: latency under 50 concurrent clients, against its floor",
            "",
            f"`roadie serve --no-worker` (uvicorn, one process) on SQLite holding one finished run of the demo "
            "invasion, and beside it its floor: a bare FastAPI app (`benchmarks/bare_app.py`: the same uvicorn, "
            "SQLAlchemy's async engine over aiosqlite made as Roadie makes it, the same database file) "
            "answering the same run's row, read "
            f"with one query, as JSON. {args.clients} concurrent `httpx` clients over loopback, each sending "
            f"{args.requests} requests one after another (after one warm-up request), in one client process on "
            f"the same machine; the three targets measured in turn, {args.rounds} rounds, medians of the rounds. "
            f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.python_implementation()} "
            f"{platform.python_version()}, {platform.system()}.",
            "",
            load_line,
            "",
            f"Command: `.venv/bin/python benchmarks/web_latency.py --write {args.write}`",
            "",
            "| request | p50 ms | p99 ms | mean ms | requests/s | p50 / floor | p99 / floor |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for label, p50, p99, mean, rate, r50, r99 in rows:
            lines.append(f"| {label} | {p50:.1f} | {p99:.1f} | {mean:.1f} | {rate:.0f} | {r50:.2f}× | {r99:.2f}× |")
        write_section(args.write, "web_latency.py", "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
