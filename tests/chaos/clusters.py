"""PostgreSQL clusters of a test's own, made with the machine's PostgreSQL binaries (Debian's
`postgresql` package, the one serving 127.0.0.1:5432): a primary, and a streaming
standby of it that can be promoted. Each lives in a temporary folder, on a port of its
own, and is stopped and removed when the test process ends; the machine's own cluster
is never touched.

The processes run as the `postgres` user (PostgreSQL refuses root), so the test must run
as root or as `postgres`.
"""

from __future__ import annotations

import atexit
import contextlib
import getpass
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg


def _bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def missing() -> str | None:
    """Why clusters cannot be made here, or None."""
    if _bin() is None:
        return "PostgreSQL's server binaries are missing (/usr/lib/postgresql/N/bin): apt-get install postgresql"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "no postgres user: apt-get install postgresql"
    if os.geteuid() != 0 and getpass.getuser() != "postgres":
        return "a cluster of the test's own runs as the postgres user: run the suite as root or postgres"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """One PostgreSQL cluster: its data folder, its port, the addresses it listens on."""

    def __init__(self, name: str, *, listen: str = "127.0.0.1", port: int | None = None) -> None:
        self.name = name
        self.home = Path(tempfile.mkdtemp(prefix=f"roadie-pg-{name}-"))
        self.home.chmod(0o755)
        self.data = self.home / "data"
        self.log = self.home / "server.log"
        self.port = port or free_port()
        self.listen = listen
        self.options: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.home, "postgres", "postgres")
        atexit.register(self.remove)

    def _as_postgres(self, tool: str, *argv: str, timeout: float = 120) -> str:
        command = [str(_bin() / tool), *argv]  # type: ignore[operator]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            tail = self.log.read_text(errors="replace")[-1500:] if self.log.exists() else ""
            raise RuntimeError(f"{tool} {' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}\n{tail}")
        return done.stdout

    def init(self, settings: dict[str, str]) -> Cluster:
        """A new, empty cluster with `settings` in its postgresql.conf, trusting every
        connection (the test's own hosts, and replication)."""
        self._as_postgres("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-instructions")
        self._configure(settings)
        return self

    def _configure(self, settings: dict[str, str]) -> None:
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())
        (self.data / "pg_hba.conf").write_text(
            "local all all trust\nhost all all 0.0.0.0/0 trust\nhost replication all 0.0.0.0/0 trust\n"
        )

    def start(self, *options: str) -> Cluster:
        """Start it, its port and addresses given on the command line (so a standby copied
        from it does not inherit them), with `options` (`-c name=value`) for this start
        only. Answers once it accepts connections."""
        self.options = list(options)
        command_line = f"-p {self.port} -c listen_addresses={self.listen} -k {self.home} {' '.join(options)}"
        self._as_postgres(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o", command_line, "start"
        )
        return self

    def stop(self, mode: str = "fast") -> None:
        """`immediate`: as a crash would, with no checkpoint and connections cut."""
        self._as_postgres("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def promote(self) -> None:
        self._as_postgres("pg_ctl", "-D", str(self.data), "-w", "promote")

    def standby(self, name: str, *, port: int | None = None) -> Cluster:
        """A streaming standby of this cluster, started, that this one's synchronous
        replication waits for once it is named in `synchronous_standby_names`."""
        other = Cluster(name, listen=self.listen, port=port)
        other._as_postgres(
            "pg_basebackup", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-D", str(other.data),
            "-X", "stream", "--checkpoint=fast",
        )  # fmt: skip
        with (other.data / "postgresql.auto.conf").open("a") as conf:
            conf.write(f"primary_conninfo = 'host=127.0.0.1 port={self.port} user=postgres application_name={name}'\n")
        (other.data / "standby.signal").touch()
        if os.geteuid() == 0:
            shutil.chown(other.data / "standby.signal", "postgres", "postgres")
        return other.start()

    def sql(self, statement: str, database: str = "postgres") -> list[tuple[object, ...]]:
        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=database, autocommit=True) as c:
            cursor = c.execute(statement)
            return cursor.fetchall() if cursor.description else []

    def wait_for_sync_standby(self, name: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        query = f"SELECT sync_state FROM pg_stat_replication WHERE application_name = '{name}'"
        while self.sql(query) != [("sync",)]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not become a synchronous standby of {self.name} in {timeout}s")
            time.sleep(0.1)

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def remove(self) -> None:
        if self.running():
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self.stop("immediate")
        shutil.rmtree(self.home, ignore_errors=True)
