"""A throwaway PostgreSQL cluster owned by one benchmark run.

The server keeps initdb's durability defaults (fsync, synchronous_commit,
full_page_writes all on): only the listen address, port and socket directory
are set, so every system is measured against the same, ordinary server.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg import sql

PG_BIN = Path(os.environ.get("JRBENCH_PG_BIN", "/usr/lib/postgresql/15/bin"))
BENCH_USER = os.environ.get("JRBENCH_PG_USER", "jrbench")

# Reported in RESULTS.md so a reader can check the server was not tuned for speed.
REPORTED_SETTINGS = (
    "server_version",
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_level",
    "wal_sync_method",
    "shared_buffers",
    "work_mem",
    "max_wal_size",
    "checkpoint_timeout",
    "max_connections",
    "autovacuum",
    "jit",
)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ensure_unprivileged_user(name: str) -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True,
        )


class Cluster:
    """initdb + pg_ctl on 127.0.0.1:<free port>; removed again by stop()."""

    def __init__(self, pg_bin: Path = PG_BIN) -> None:
        self.pg_bin = pg_bin
        self.root = Path(tempfile.mkdtemp(prefix="jrbench-pg-"))
        self.datadir = self.root / "data"
        self.logfile = self.root / "server.log"
        self.port = _free_port()
        self.started = False
        # PostgreSQL refuses to run as root; run its tools as an ordinary user then.
        self.prefix: list[str] = []
        if os.geteuid() == 0:
            _ensure_unprivileged_user(BENCH_USER)
            entry = pwd.getpwnam(BENCH_USER)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
            self.prefix = ["runuser", "-u", BENCH_USER, "--"]

    def _tool(self, name: str, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [*self.prefix, str(self.pg_bin / name), *args]
        return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=180)

    def start(self) -> None:
        # --no-sync only skips initdb's own final flush of the fresh files; the
        # running server keeps fsync=on.
        self._tool(
            "initdb",
            "-D",
            str(self.datadir),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        )
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root}"
        self._tool(
            "pg_ctl",
            "-D",
            str(self.datadir),
            "-l",
            str(self.logfile),
            "-w",
            "-t",
            "60",
            "-o",
            options,
            "start",
        )
        self.started = True

    def stop(self) -> None:
        if self.started:
            for mode in ("fast", "immediate"):
                try:
                    self._tool("pg_ctl", "-D", str(self.datadir), "-m", mode, "-w", "stop")
                    break
                except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
                    continue
            self.started = False
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    @contextlib.contextmanager
    def admin(self) -> Iterator[psycopg.Connection]:
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            yield conn

    def createdb(self, name: str, template: str | None = None, file_copy: bool = False) -> str:
        stmt = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            stmt += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
            if file_copy:
                # Big templates copy faster as files than block by block through WAL.
                stmt += sql.SQL(" STRATEGY FILE_COPY")
        with self.admin() as conn:
            conn.execute(stmt)
        return self.url(name)

    def dropdb(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    def checkpoint(self) -> None:
        with self.admin() as conn:
            conn.execute("CHECKPOINT")

    def cpu_seconds(self) -> float:
        """CPU used so far by the server: the postmaster with the backends that exited, and
        every live child (backends, WAL writer, autovacuum)."""
        postmaster = int((self.datadir / "postmaster.pid").read_text().split()[0])
        ticks = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat.parent.name) == postmaster:
                ticks += sum(int(f) for f in fields[11:15])
            elif int(fields[1]) == postmaster:
                ticks += int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")

    def settings(self) -> dict[str, str]:
        with self.admin() as conn:
            rows = conn.execute(
                "SELECT name, current_setting(name) FROM pg_settings"
                " WHERE name = ANY(%s) ORDER BY name",
                [list(REPORTED_SETTINGS)],
            ).fetchall()
        return dict(rows)


@contextlib.contextmanager
def throwaway_cluster(pg_bin: Path = PG_BIN) -> Iterator[Cluster]:
    """A started cluster, stopped and deleted on the way out (also on Ctrl-C)."""
    cluster = Cluster(pg_bin)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
