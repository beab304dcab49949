"""Shared fixtures: a whole Roadie (clock, registry, store, engine) in a temp dir.

A test gets a `Harness` from the `harness` fixture (the sandbox world plus the `probe`
test module) or builds one with `make_harness(*extra_modules)`. The store is async, so
it is opened inside the test's own event loop: write the test body as a coroutine and
hand it to `Harness.run`, which opens the store and engine, awaits the body, and closes
them again.

```python
def test_something(harness: Harness) -> None:
    async def body() -> None:
        run = await harness.start(EVENT_YAML)
        [run] = await harness.settle(run)
        assert run.status == "succeeded"

    harness.run(body)
```

The `probe` module is a ledger action whose behaviour is chosen by the step's `with:`
(what to answer, when to fail, whether to hang) and which records every call and revert,
so a test can see exactly what the engine asked of a module. Its `observe` hook is
called from inside each dispatch, for tests that look at the store mid-call.
"""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiosqlite
import pytest
import structlog
from click.testing import Result
from pydantic import BaseModel, ConfigDict
from sqlalchemy import select
from sqlalchemy.pool import NullPool
from typer.testing import CliRunner

from roadie.clock import FakeClock
from roadie.definitions import load_definition
from roadie.engine import Engine, EngineOptions
from roadie.engine.notify import Webhook
from roadie.errors import AnswerLost, PermanentError, RetryableError
from roadie.modules.sandbox import SandboxWorld
from roadie.registry import (
    Call,
    FenceMarks,
    LeaseCall,
    Module,
    ModuleConfig,
    Registry,
    RevertCall,
    build_registry,
)
from roadie.states import Reversible
from roadie.store import Store, dialects, tables
from roadie.store.rows import EventRow, ResourceRow, RunRow, StepRow
from tests.databases import BACKENDS, PLANTED_PASSWORD, Database, check_reachable

# pytest-xdist gives its workers COLUMNS=80 and LINES=24, where the CLI would cut its tables
# to 80 columns; every test runs the commands as an operator's pipe would, at any width.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

# -- fault injection at the store's named write points ------------------------------------


class Crash(Exception):
    """A worker died just before a write transaction committed (raised by `WritePoints`)."""


class WritePoints:
    """The store's `write_point` hook: `arm(name)` makes the next commit of `name` crash."""

    def __init__(self) -> None:
        self.armed: dict[str, list[int]] = {}  # name -> [commits to let through, crashes left]
        self.hits: list[str] = []
        self.extra: Callable[[str], None] | None = None  # another fault, called at every write point

    def arm(self, name: str, times: int = 1, *, skip: int = 0) -> None:
        self.armed[name] = [skip, times]

    def __call__(self, name: str) -> None:
        self.hits.append(name)
        if self.extra is not None:
            self.extra(name)
        plan = self.armed.get(name)
        if plan is None or plan[1] == 0:
            return
        if plan[0] > 0:
            plan[0] -= 1
            return
        plan[1] -= 1
        raise Crash(f"crashed before committing {name}")


# -- the probe test module ----------------------------------------------------------------


class MakeParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    answer: Any = None  # returned as is: a list of resources, an Answer-like dict, junk...
    fail_first: int = 0  # raise RetryableError on the first N attempts
    error: Literal["permanent", "lost", "retryable"] | None = None  # raise this on every attempt
    hang: bool = False  # never answer
    hold: float = 0.0  # wait this long on the clock before answering


@dataclass
class Dispatched:
    key: str
    attempt: int
    at: Any
    run_id: int
    outcome: str = "in flight"  # "answered" | "raised" | "cancelled"
    fence: int = 0


@dataclass
class ProbeState:
    """What the probe module saw. Tests read it, and may set the knobs."""

    calls: list[Dispatched] = field(default_factory=list)
    reverts: list[RevertCall] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    fail_reverts: int = 0  # the next N reverts raise RetryableError
    broken_reverts: bool = False  # every revert raises (the module is gone for good)
    observe: Callable[[Call[Any]], Awaitable[None]] | None = None  # awaited inside each dispatch
    answer: Any = None  # when set, answered instead of the step's `answer` (for what YAML cannot say)
    dial: float = 1.0  # the value behind the untargeted lease `probe.dial`
    observe_dial_read: Callable[[LeaseCall], Awaitable[None]] | None = None  # awaited inside each read
    observe_dial: Callable[[LeaseCall, Any], Awaitable[None]] | None = None  # awaited after each write
    before_dial_write: Callable[[LeaseCall, Any], Awaitable[None]] | None = None  # awaited before each write
    observe_revert: Callable[[RevertCall], Awaitable[None]] | None = None  # awaited inside each revert
    offline: str | None = None  # when set, the module says it is offline, and why
    fences: FenceMarks = field(default_factory=FenceMarks)  # refused as a module must (protocol §4 rule 7)
    written: list[tuple[float, int]] = field(default_factory=list)  # each dial write, with its fence

    def calls_of(self, key: str) -> list[Dispatched]:
        return [c for c in self.calls if c.key == key]


def probe_module() -> Module:
    """A fresh `probe` module: action `probe.make` (ledger) and lease `probe.dial`."""
    probe = Module("probe", "a test module that does what its step says and remembers it")

    @probe.setup
    def setup(config: ModuleConfig) -> ProbeState:
        return ProbeState()

    @probe.action("make", reversible=Reversible.LEDGER, params=MakeParams)
    async def make(call: Call[MakeParams]) -> Any:
        state: ProbeState = call.state
        p = call.params
        record = Dispatched(call.idempotency_key, call.attempt, call.clock.now(), call.run_id, fence=call.fence)
        state.calls.append(record)
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            state.fences.accept(call.idempotency_key, call.fence)
            if state.observe is not None:
                await state.observe(call)
            if p.hold:
                await call.clock.sleep(p.hold)
            if p.hang:
                await asyncio.Event().wait()
            state.fences.check(call.idempotency_key, call.fence)  # what it makes, it makes now
            if call.attempt <= p.fail_first or p.error == "retryable":
                raise RetryableError(f"probe: attempt {call.attempt} fails")
            if p.error == "permanent":
                raise PermanentError("probe: this can never work")
            if p.error == "lost":
                raise AnswerLost("probe: the answer went missing")
        except asyncio.CancelledError:
            record.outcome = "cancelled"
            raise
        except Exception:
            record.outcome = "raised"
            raise
        finally:
            state.in_flight -= 1
        record.outcome = "answered"
        return p.answer if state.answer is None else state.answer

    @make.revert
    async def unmake(call: RevertCall) -> None:
        state: ProbeState = call.state
        if state.observe_revert is not None:
            await state.observe_revert(call)
        state.fences.accept(call.idempotency_key, call.fence)
        state.reverts.append(call)
        if state.broken_reverts:
            raise RuntimeError("probe: this module is gone")
        if state.fail_reverts > 0:
            state.fail_reverts -= 1
            raise RetryableError("probe: revert failed")

    @probe.online
    def online(state: ProbeState) -> str | None:
        return state.offline

    @probe.lease("dial")
    async def read_dial(call: LeaseCall) -> float:
        state: ProbeState = call.state
        if state.observe_dial_read is not None:
            await state.observe_dial_read(call)
        return state.dial

    @read_dial.write
    async def write_dial(call: LeaseCall, value: Any) -> None:
        state: ProbeState = call.state
        if state.before_dial_write is not None:
            await state.before_dial_write(call, value)
        state.fences.accept(call.lease, call.fence, lease=True)
        state.dial = float(value)
        state.written.append((state.dial, call.fence))
        if state.observe_dial is not None:
            await state.observe_dial(call, value)

    return probe


# -- the harness ----------------------------------------------------------------------------


class Harness:
    """A clock, a registry (sandbox + extra modules), a store on a fresh database, an engine."""

    def __init__(self, tmp_path: Path, extra: tuple[Module, ...] = (), database_url: str | None = None) -> None:
        self.tmp_path = tmp_path
        self.database_url = database_url or f"sqlite:///{tmp_path / 'roadie.db'}"
        self.clock = FakeClock()
        self.registry: Registry = build_registry({"sandbox": {"db": str(tmp_path / "world.db")}}, clock=self.clock)
        for module in extra:
            self.registry.register(module)
        self.world: SandboxWorld = self.registry.state("sandbox")
        self.write_points = WritePoints()
        self.options = EngineOptions(seed=1)
        self.webhooks: list[Webhook] = []  # the engine's, from its next restart
        self._store: Store | None = None
        self._engine: Engine | None = None

    @property
    def probe(self) -> ProbeState:
        state: ProbeState = self.registry.state("probe")
        return state

    @property
    def store(self) -> Store:
        assert self._store is not None, "the store is open only inside Harness.run"
        return self._store

    @property
    def engine(self) -> Engine:
        assert self._engine is not None, "the engine exists only inside Harness.run"
        return self._engine

    # -- lifecycle

    def run(self, body: Callable[[], Awaitable[None]]) -> None:
        """Open the store and engine in a fresh event loop, await `body()`, close them."""

        async def main() -> None:
            await self.restart()
            try:
                await body()
            finally:
                await self.engine.close()
                await self.store.close()

        asyncio.run(main())

    async def restart(self) -> None:
        """A fresh store and engine (a new worker) on the same files: what a restart after a
        crash sees. The write-point hook carries over, with whatever it has left armed."""
        if self._engine is not None:
            await self._engine.close()
        if self._store is not None:
            await self._store.close()
        self._store = await Store.open(self.database_url)
        self._store.write_point = self.write_points
        self._engine = Engine(
            self._store, self.registry, clock=self.clock, options=self.options, webhooks=self.webhooks
        )

    def store_writes(self, name: str) -> int:
        """How many write transactions named `name` reached their commit so far."""
        return self.write_points.hits.count(name)

    async def peek(self, *columns: Any) -> list[tuple[Any, ...]]:
        """`columns` of every ledger row, read through a connection of its own, as another
        process would see the database at this moment."""
        engine = dialects.create_engine(self.database_url, poolclass=NullPool)
        try:
            async with engine.connect() as conn:
                query = select(*columns).order_by(tables.run_resources.c.id)
                return [tuple(row) for row in await conn.execute(query)]
        finally:
            await engine.dispose()

    # -- events and runs

    async def apply(self, text: str) -> EventRow:
        """Validate an event from YAML and store it, as `roadie apply` does."""
        definition = load_definition(text, "test.yaml", self.registry)
        return await self.store.create_event_version(
            definition.id,
            definition.title,
            definition.model_dump(mode="json", by_alias=True),
            text,
            "test",
            self.clock.now(),
        )

    async def start(self, text: str, params: dict[str, Any] | None = None, *, force: bool = False) -> RunRow:
        """Apply the event in `text` and start a run of it (`force`: over what pre-flight finds)."""
        return await self.engine.start_run(await self.apply(text), params, force=force)

    async def settle(self, *runs: RunRow | int, max_ticks: int = 1000) -> list[RunRow]:
        """`Engine.settle`: work (jumping the clock) until the runs have ended and cleaned up.
        Few ticks are allowed, so a run that can never settle fails the test quickly."""
        return await self.engine.settle([r if isinstance(r, int) else r.id for r in runs], max_ticks=max_ticks)

    async def drive(self, work: Awaitable[Any], *, quiet: float = 0.01, limit: int = 2000) -> Any:
        """Await `work` while time passes: whenever the loop has been quiet for `quiet` real
        seconds and no database call is under way, move the FakeClock to its next sleeper.
        For steps that sleep or hang. (A database call is not quiet: moving the clock
        during one would let a later deadline fire before the engine saw an earlier one.)"""
        task = asyncio.ensure_future(work)
        for _ in range(limit):
            await asyncio.wait({task}, timeout=quiet)
            # On a loaded machine the quiet time may pass while the loop had no turn: the
            # engine's ready callbacks (a wait that just ended, on its way to its next
            # database call) get a few turns before the clock may move under them.
            for _ in range(5):
                await asyncio.sleep(0)
            if task.done():
                return task.result()
            if self.store.active:
                continue
            deadline = self.clock.next_deadline()
            if deadline is not None:
                self.clock.set(deadline)
        task.cancel()
        raise AssertionError("the work did not finish while driving the clock")

    # -- reading

    async def get_run(self, run: RunRow | int) -> RunRow:
        return await self.store.get_run(run if isinstance(run, int) else run.id)

    async def steps(self, run: RunRow | int) -> list[StepRow]:
        return await self.store.list_steps(run if isinstance(run, int) else run.id)

    async def step(self, run: RunRow | int, name: str) -> StepRow:
        [found] = [s for s in await self.steps(run) if s.name == name]
        return found

    async def resources(self, run: RunRow | int, kind: str | None = None) -> list[ResourceRow]:
        rows = await self.store.list_resources(run if isinstance(run, int) else run.id)
        return [r for r in rows if kind is None or r.kind == kind]


PLANTED_SECRETS = (PLANTED_PASSWORD, "planted-secret")
"""Secrets the tests put where an operator's would be (the database password of every
PostgreSQL URL; the passwords and keys of tests that plant their own); no command may
print one."""


@pytest.fixture(autouse=True)
def _no_secret_in_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command a test runs through `CliRunner` has its output (stdout, stderr and
    the logs written there) scanned for the planted secrets."""
    invoke = CliRunner.invoke

    def scanned(self: CliRunner, *args: Any, **kwargs: Any) -> Result:
        result = invoke(self, *args, **kwargs)
        printed = result.stdout_bytes + (result.stderr_bytes or b"")
        for secret in PLANTED_SECRETS:
            assert secret.encode() not in printed, f"{secret!r} printed by roadie {args[1:2]}: {result.output}"
        return result

    monkeypatch.setattr(CliRunner, "invoke", scanned)


@pytest.fixture(autouse=True)
def _default_logging() -> Iterator[None]:
    """structlog's configuration is global to the process, and the CLI binds it to the
    stderr of the moment, which a test runner closes after that test: every test starts,
    and leaves, with structlog's defaults."""
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()


# -- SQLite connections left open ---------------------------------------------------------

_left_open: list[str] = []
"""The tests in which each aiosqlite connection collected unclosed was opened."""


def _name_the_opener() -> None:
    """aiosqlite warns when it collects a connection left open, but at whatever later test
    the garbage collector happens to run in. Each connection is marked with the test that
    opened it, and `_sqlite_connections_closed` collects garbage after every module, so a
    leak fails in the module that made it and names the test."""
    connect, delete = aiosqlite.core.connect, aiosqlite.core.Connection.__del__

    def marked(*args: Any, **kwargs: Any) -> aiosqlite.Connection:
        connection = connect(*args, **kwargs)
        connection._opened_in = os.environ.get("PYTEST_CURRENT_TEST", "no test")  # type: ignore[attr-defined]
        return connection

    def noted(self: aiosqlite.Connection) -> None:
        if self._connection is not None:
            _left_open.append(getattr(self, "_opened_in", "no test"))
        delete(self)

    aiosqlite.connect = aiosqlite.core.connect = marked  # type: ignore[assignment]
    aiosqlite.core.Connection.__del__ = noted  # type: ignore[method-assign]


_name_the_opener()


@pytest.fixture(autouse=True, scope="module")
def _sqlite_connections_closed() -> Iterator[None]:
    yield
    gc.collect()
    left, _left_open[:] = list(_left_open), []
    assert not left, f"aiosqlite connections collected unclosed, opened in: {left}"


@pytest.fixture
def make_harness(tmp_path: Path, database: Database) -> Iterator[Callable[..., Harness]]:
    """Build a `Harness` with the given extra modules registered next to the sandbox, on
    a fresh database of the backend this test is parametrised with."""
    made: list[Harness] = []

    def make(*extra: Module) -> Harness:
        home = tmp_path / f"harness{len(made)}"
        home.mkdir()
        made.append(Harness(home, extra, database.fresh(home)))
        return made[-1]

    yield make
    for h in made:
        asyncio.run(h.registry.close())
    database.drop_all()


@pytest.fixture
def harness(make_harness: Callable[..., Harness]) -> Harness:
    """A `Harness` with the sandbox world and a fresh `probe` module."""
    return make_harness(probe_module())


# -- the chaos suite's sizes -----------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("roadie chaos")
    group.addoption(
        "--chaos-trials",
        type=int,
        default=int(os.environ.get("ROADIE_CHAOS_TRIALS", "3")),
        help="SIGKILL trials per write point and database in tests/chaos (default 3, or ROADIE_CHAOS_TRIALS)",
    )
    group.addoption(
        "--chaos-trials-mariadb",
        type=int,
        default=int(os.environ.get("ROADIE_CHAOS_TRIALS_MARIADB", "0")) or None,
        help="the same on MariaDB, whose trials are the slowest (default a fifth of --chaos-trials, at least 1)",
    )
    group.addoption(
        "--soak-runs",
        type=int,
        default=int(os.environ.get("ROADIE_SOAK_RUNS", "20")),
        help="runs of the random-fault soak in tests/chaos (default 20, or ROADIE_SOAK_RUNS)",
    )

    group.addoption(
        "--sim-seeds",
        type=int,
        default=int(os.environ.get("ROADIE_SIM_SEEDS", "0")) or None,
        help="seeds of tests/sim on SQLite (a fifth of it on each server); default its CI size, or ROADIE_SIM_SEEDS",
    )


@pytest.fixture
def chaos_trials(request: pytest.FixtureRequest) -> int:
    """Trials per point for this test's database (MariaDB's are sized apart)."""
    trials: int = request.config.getoption("--chaos-trials")
    backend = getattr(request.node, "callspec", None) and request.node.callspec.params.get("database")
    if backend == "mariadb":
        mariadb: int | None = request.config.getoption("--chaos-trials-mariadb")
        return mariadb if mariadb is not None else max(1, trials // 5)
    return trials


@pytest.fixture
def soak_runs(request: pytest.FixtureRequest) -> int:
    runs: int = request.config.getoption("--soak-runs")
    return runs


# -- the databases --------------------------------------------------------------------------


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test that uses `database` (through `harness`) runs once per backend."""
    if "database" in metafunc.fixturenames:
        metafunc.parametrize("database", BACKENDS, indirect=True)


@pytest.fixture
def database(request: pytest.FixtureRequest) -> Database:
    """This test's backend. An unreachable server skips locally and fails in CI."""
    backend: str = request.param
    problem = check_reachable(backend)
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(problem)
        pytest.skip(problem)
    return Database(backend)
