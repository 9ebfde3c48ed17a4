"""Shared pieces of the fault suite: real tick processes, the execution log kept
outside the database, and a private PostgreSQL server that tests may restart or
stop (the shared test server is never touched)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import jobrunner_process

HANDLERS = "tests.handlers.faults"


# -- the database clock -------------------------------------------------------


def db_now(conn: psycopg.Connection[Any]) -> datetime:
    return conn.execute("SELECT now()").fetchone()[0]


# -- the execution log -------------------------------------------------------


@dataclass(frozen=True)
class Execution:
    run_id: int
    attempt: int
    pid: int
    event: str


class ExecLog:
    """What handlers did, as they wrote it themselves (not what the database says)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def entries(self, event: str | None = "run") -> list[Execution]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        found = []
        for line in text.splitlines():
            run_id, attempt, pid, *rest = line.split()
            entry = Execution(int(run_id), int(attempt), int(pid), rest[0] if rest else "run")
            if event is None or entry.event == event:
                found.append(entry)
        return found

    def of(self, run_id: int, event: str | None = "run") -> list[Execution]:
        return [e for e in self.entries(event) if e.run_id == run_id]


@pytest.fixture
def exec_log(tmp_path: Path) -> ExecLog:
    return ExecLog(tmp_path / "executions.log")


@pytest.fixture
def exec_log_here(exec_log: ExecLog, monkeypatch: pytest.MonkeyPatch) -> ExecLog:
    """Handlers run by library-level ticks in this process write to the same log."""
    monkeypatch.setenv("JOBRUNNER_TEST_EXEC_LOG", str(exec_log.path))
    return exec_log


# -- tick processes ----------------------------------------------------------


class TickProcess:
    """A real `jobrunner tick`, its logs kept in a file so a full pipe never blocks it."""

    def __init__(self, proc: subprocess.Popen[str], log_path: Path) -> None:
        self.proc = proc
        self.log_path = log_path
        self._stdout: str | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout=timeout)

    def stdout(self) -> str:
        if self._stdout is None:
            assert self.proc.stdout is not None
            self._stdout = self.proc.stdout.read()
        return self._stdout

    def summary(self) -> dict[str, Any]:
        """The --json summary line on stdout."""
        return json.loads(self.stdout())

    def stderr(self) -> str:
        return self.log_path.read_text(errors="replace")

    def plain_lines(self) -> list[str]:
        """The lines of stderr that are not JSON log events: a failing command's one line."""
        plain = []
        for line in self.stderr().splitlines():
            try:
                json.loads(line)
            except ValueError:
                plain.append(line)
        return plain

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        found = []
        for line in self.stderr().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a process killed mid-write leaves half a line
            if isinstance(event, dict) and (name is None or name in event.get("event", "")):
                found.append(event)
        return found

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def start_tick(tmp_path: Path, exec_log: ExecLog) -> Iterator[Callable[..., TickProcess]]:
    """Start `jobrunner tick --database-url URL --handlers tests.handlers.faults ARGS`."""
    started: list[TickProcess] = []

    def start(url: str, *args: str, env: dict[str, str] | None = None) -> TickProcess:
        log_path = tmp_path / f"tick-{len(started)}.log"
        proc = jobrunner_process(
            "tick",
            "--database-url",
            url,
            "--handlers",
            HANDLERS,
            "--json",
            *args,
            env={"JOBRUNNER_TEST_EXEC_LOG": str(exec_log.path), **(env or {})},
            stderr=log_path.open("w"),
        )
        tick = TickProcess(proc, log_path)
        started.append(tick)
        return tick

    yield start
    for tick in started:
        if tick.proc.poll() is None:
            tick.proc.send_signal(signal.SIGCONT)  # a test that failed while it was stopped
            tick.kill()


# -- a private server --------------------------------------------------------


class PrivateServer:
    """A throwaway PostgreSQL cluster of this test session, to restart and stop at will."""

    def __init__(self, root: Path, bin_dir: Path, user: str | None) -> None:
        self.root = root
        self.data = root / "data"
        self.bin_dir = bin_dir
        self.user = user
        self.url = f"postgresql://postgres@/jobrunner?host={root}"
        self.admin_url = f"postgresql://postgres@/postgres?host={root}"

    def _run(self, tool: str, *args: str, timeout: float = 60) -> None:
        subprocess.run(
            [str(self.bin_dir / tool), *args],
            check=True,
            user=self.user,
            cwd=self.root,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=timeout,
        )

    def init(self) -> None:
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-sync",
            "--no-instructions",
        )
        self.start()
        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            admin.execute("CREATE DATABASE jobrunner")

    def start(self, *settings: str) -> None:
        """Start the server, with `settings` ("name=value") beside the suite's own."""
        options = f"-c listen_addresses='' -k {self.root} -c fsync=off -c full_page_writes=off"
        options += "".join(f" -c {setting}" for setting in settings)
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.root / "server.log"),
            "-o",
            options,
            "-w",
            "-t",
            "30",
            "start",
        )

    def stop_cleanly(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def copy_from(self, template: PrivateServer) -> None:
        """This server's data directory, a copy of `template`'s (stopped, not started)."""
        copy = ["cp", "-a", str(template.data), str(self.data)]
        subprocess.run(copy, check=True, user=self.user, capture_output=True, timeout=60)

    def clone_from(self, primary: PrivateServer, *options: str) -> None:
        """Make this server a streaming standby of `primary` (pg_basebackup -R; not started)."""
        self._run(
            "pg_basebackup",
            "-D",
            str(self.data),
            "-h",
            str(primary.root),
            "-U",
            "postgres",
            "-X",
            "stream",
            "-c",
            "fast",
            "-R",
            *options,
        )

    def promote(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "30", "promote")

    def restart_fast(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "30", "restart")

    def restart_immediate(self) -> None:
        """As a crash would: no checkpoint, recovery from the log at start."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "-t", "30", "restart")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    @property
    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def destroy(self) -> None:
        if self.running:
            with contextlib.suppress(subprocess.SubprocessError):
                self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
        from tests.pgserver import remove_copy

        remove_copy(self.bin_dir)


def _private_server_binaries() -> tuple[Path, str | None]:
    from tests import pgserver

    bindir = pgserver.server_binaries()
    if bindir is None:
        pytest.skip("a private server needs PostgreSQL's server binaries")
    if os.geteuid() != 0:
        return bindir, None
    # PostgreSQL refuses to run as root: run it as the tests' unprivileged account.
    try:
        user = pgserver.account()
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot create an unprivileged account to run PostgreSQL as: {exc}")
    return pgserver.runnable_binaries(bindir, user), user.pw_name


@pytest.fixture(scope="session")
def private_server() -> Iterator[PrivateServer]:
    from cronjob import migrate

    bin_dir, user = _private_server_binaries()
    # Short, and outside pytest's root-only tmp directory: it holds the socket and
    # must be reachable by the server's own user.
    root = Path(tempfile.mkdtemp(prefix="jr-pg-", dir="/tmp"))
    if user is not None:
        shutil.chown(root, user=user, group=user)
    server = PrivateServer(root, bin_dir, user)
    try:
        server.init()
    except (subprocess.SubprocessError, OSError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        server.destroy()
        pytest.skip(f"cannot start a private PostgreSQL server: {exc} {detail.decode()[-300:]}")
    with psycopg.connect(server.url, autocommit=True) as conn:
        migrate.apply(conn)
    yield server
    server.destroy()


@pytest.fixture
def private_db(private_server: PrivateServer) -> str:
    """The private server, running, with every jobrunner table emptied."""
    if not private_server.running:
        private_server.start()
    with psycopg.connect(private_server.url, autocommit=True) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = 'public'"
                " AND tablename <> 'jobrunner_migrations'"
            )
        ]
        conn.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")
    return private_server.url
