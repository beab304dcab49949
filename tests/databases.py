"""The databases the suite runs on (the `database` fixture in conftest.py uses these).

`ROADIE_TEST_DATABASES` picks the backends (default: all four). Every test that uses
the `database` fixture (through `harness`) runs once per backend, each on a database of
its own. A server that cannot be reached skips its tests on a developer's machine and
fails them in CI (`CI=true`), where a skip would hide a missing service.

`pgbouncer` is the PostgreSQL server behind PgBouncer in transaction pooling mode, as
operators run it: started here, once per test process, on a free port (or named by
`ROADIE_TEST_PGBOUNCER`), from the build `make pgbouncer` makes (the Makefile says why
not Debian 12's own) or the binary `ROADIE_TEST_PGBOUNCER_BINARY` names. Consecutive
transactions of one connection of Roadie's may then run on different server connections,
so whatever leans on session state (prepared statements unless the URL says
`prepare_threshold=none`, session advisory locks, `SET`) fails there.
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.engine import make_url

from roadie.store import dialects

SERVERS = {
    "postgresql": os.environ.get("ROADIE_TEST_POSTGRESQL", "postgresql://postgres@127.0.0.1:5432/test"),
    "mariadb": os.environ.get("ROADIE_TEST_MARIADB", "mysql://root@127.0.0.1:3306/test"),
}
# A password put into every PostgreSQL URL the tests hand out (trust auth ignores it), so
# that the scan in tests/conftest.py finds it wherever a command prints it.
PLANTED_PASSWORD = "planted-db-password-7f3a"
BACKENDS = [
    b.strip() for b in os.environ.get("ROADIE_TEST_DATABASES", "sqlite,postgresql,mariadb,pgbouncer").split(",") if b
]
DIALECTS = {"sqlite": "sqlite", "postgresql": "postgresql", "pgbouncer": "postgresql", "mariadb": "mysql"}
_reachable: dict[str, str | None] = {}


async def _admin(url: str, *statements: str) -> None:
    engine = dialects.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            for statement in statements:
                await conn.exec_driver_sql(statement)
    finally:
        await engine.dispose()


def check_reachable(backend: str) -> str | None:
    """None when the backend's server answers (or needs none), else why not."""
    if backend == "sqlite":
        return None
    if backend == "pgbouncer" and backend not in SERVERS:
        problem = check_reachable("postgresql")
        if problem is not None:
            return problem
        try:
            SERVERS["pgbouncer"] = os.environ.get("ROADIE_TEST_PGBOUNCER") or _start_pgbouncer(SERVERS["postgresql"])
        except RuntimeError as exc:
            _reachable[backend] = str(exc)
    if backend not in SERVERS and backend in _reachable:
        return _reachable[backend]
    if backend not in SERVERS:
        return f"unknown test database {backend!r} (known: sqlite, {', '.join(SERVERS)})"
    if backend not in _reachable:
        try:
            asyncio.run(asyncio.wait_for(_admin(SERVERS[backend], "SELECT 1"), 10))
            _reachable[backend] = None
        except Exception as exc:
            _reachable[backend] = f"{backend} at {SERVERS[backend]} is unreachable: {exc}"
    return _reachable[backend]


@dataclass
class Database:
    """One backend for one test: `fresh()` makes an empty database and answers its URL."""

    backend: str
    made: list[str] = field(default_factory=list)

    @property
    def dialect(self) -> str:
        """What Roadie sees: PgBouncer speaks PostgreSQL."""
        return DIALECTS[self.backend]

    @property
    def _admin_url(self) -> str:
        """Where databases are made and dropped: the server itself, never through a pool."""
        return SERVERS["postgresql" if self.backend == "pgbouncer" else self.backend]

    def fresh(self, home: Path) -> str:
        if self.backend == "sqlite":
            return f"sqlite:///{home / 'roadie.db'}"
        if self.backend == "pgbouncer" and _bouncer is not None:
            _bouncer.ensure_running()
        name = f"roadie_{secrets.token_hex(6)}"
        asyncio.run(_admin(self._admin_url, f"CREATE DATABASE {name}"))
        self.made.append(name)
        url = make_url(SERVERS[self.backend]).set(database=name)
        if self.dialect == "postgresql" and url.password is None:
            url = url.set(password=PLANTED_PASSWORD)
        return url.render_as_string(hide_password=False)

    def drop_all(self) -> None:
        # PgBouncer keeps server connections to a database after its clients are gone.
        force = " WITH (FORCE)" if self.backend == "pgbouncer" else ""
        for name in self.made:
            drop = f"DROP DATABASE IF EXISTS {name}{force}"
            try:
                asyncio.run(_admin(self._admin_url, drop))
            except Exception as exc:
                if "is being accessed by other users" not in str(exc):
                    raise
                # A connection a cancelled task left behind is closed only when the
                # garbage collector frees it (the server's log then says the client reset
                # it): free it, and drop again. Its close may still be on its way to the
                # server (seen under load once in a few hundred runs): the test is over,
                # so the server is told to end that session.
                gc.collect()
                asyncio.run(_admin(self._admin_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        self.made.clear()


def is_pooled(url: str) -> bool:
    """Whether `url` reaches its server through the PgBouncer these tests started."""
    bouncer = SERVERS.get("pgbouncer")
    return bouncer is not None and make_url(url).port == make_url(bouncer).port


class _Bouncer:
    """The PgBouncer process these tests run. Should it die (it did once in CI, midway,
    and the logs were gone with its folder), it is started again on its port, and the test
    that found it dead fails with its logs' tail, instead of every later test of the
    backend failing with "connection refused" and nothing to say why."""

    def __init__(self, argv: list[str], home: Path, port: int) -> None:
        self.argv, self.home, self.port = argv, home, port
        self.process = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        # Its stderr goes to a file: a pipe nobody reads fills up, and PgBouncer then blocks.
        with (self.home / "stderr.log").open("ab") as stderr:
            process = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=stderr)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited {process.returncode}: {self._said()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return process
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("pgbouncer did not listen within 30 s")

    def _said(self) -> str:
        said = [(self.home / name).read_text(errors="replace")[-800:] for name in ("stderr.log", "pgbouncer.log")]
        return " | ".join(s for s in said if s.strip()) or "(nothing in its logs)"

    def ensure_running(self) -> None:
        if self.process.poll() is None:
            return
        ended, said = self.process.returncode, self._said()
        self.process = self._start()
        # An error under the suite's filterwarnings: the test that found it fails, naming it.
        warnings.warn(f"pgbouncer had exited ({ended}); started again. Its logs: {said}", stacklevel=2)

    def stop(self) -> None:
        self.process.kill()  # nothing of its own to keep: the server holds the data
        self.process.wait(10)
        shutil.rmtree(self.home, ignore_errors=True)


_bouncer: _Bouncer | None = None


def _start_pgbouncer(server_url: str) -> str:
    """Start PgBouncer in transaction pooling mode in front of `server_url`, for as long as
    this process lives; answer its URL."""
    built = sorted(Path(__file__).parent.parent.glob(".cache/pgbouncer-*/bin/pgbouncer"))
    binary = os.environ.get("ROADIE_TEST_PGBOUNCER_BINARY") or (str(built[-1]) if built else "")
    if not os.path.exists(binary):
        raise RuntimeError("pgbouncer is not built: run `make pgbouncer` (`make test` does)")
    server = make_url(server_url)
    home = Path(tempfile.mkdtemp(prefix="roadie-pgbouncer-"))
    home.chmod(0o777)  # it drops root for the postgres user, who writes its log and pid here
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (home / "users.txt").write_text(f'"{server.username}" ""\n')
    (home / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={server.host} port={server.port or 5432}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {home / 'users.txt'}\n"
        "pool_mode = transaction\nmax_client_conn = 2000\n"
        # Each test has a database of its own, and the server 100 connections for all of
        # them: a few per database, given back to the server soon after they go idle.
        "default_pool_size = 8\nmax_db_connections = 8\nserver_idle_timeout = 5\n"
        "log_connections = 0\nlog_disconnections = 0\n"
        f"logfile = {home / 'pgbouncer.log'}\npidfile = {home / 'pgbouncer.pid'}\n"
    )
    argv = [binary, str(home / "pgbouncer.ini")]
    if os.geteuid() == 0:
        argv[1:1] = ["-u", "postgres"]  # it refuses to run as root
    global _bouncer
    _bouncer = _Bouncer(argv, home, port)
    atexit.register(_bouncer.stop)
    # Transaction pooling: no statement prepared on one server connection is there on the
    # next (docs/deploy.md, "Behind PgBouncer").
    bouncer = server.set(host="127.0.0.1", port=port).update_query_dict({"prepare_threshold": "none"})
    return bouncer.render_as_string(hide_password=False)
