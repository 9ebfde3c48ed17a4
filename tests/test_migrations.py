"""A migration that runs outside a transaction: the idempotency index of 0017, built
concurrently on a live job_runs, rebuilt after a build that did not finish, applied by
one host while the others wait for it, and watched on a terminal (what it waits for; Ctrl-C).

Real `jobrunner migrate` processes against a database migrated as far as the migration
before it. Each test holds what keeps the build waiting (a write in an open transaction:
a concurrent build waits for every older writer to end) until the server shows it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from cronjob import store
from cronjob.migrate import shipped_migrations
from tests.conftest import jobrunner_process, run_cli, wait_for
from tests.terminal import OnTerminal

ALONE = 17  # the idempotency index, built concurrently
NEW_INDEX, OLD_INDEX = "job_runs_idempotency_key_per_work", "job_runs_idempotency_key"


@pytest.fixture
def before_the_build(empty_database_url: str) -> Iterator[str]:
    """A database with every migration before 0017 applied, and one run holding key K."""
    with psycopg.connect(empty_database_url, autocommit=True) as conn, conn.transaction():
        store.migrations_create_table(conn)
        for m in shipped_migrations():
            if m.version < ALONE:
                store.migration_apply(conn, m.path.read_text(), m.version, m.name)
        conn.execute(
            "INSERT INTO job_runs (job_type, tenant_id, idempotency_key) VALUES ('t', 'acme', 'K')"
        )
    yield empty_database_url


def indexes(url: str) -> dict[str, bool]:
    """jobrunner's idempotency indexes, and whether each is valid."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT c.relname, i.indisvalid FROM pg_index i"
            " JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = ANY(%s)",
            [[NEW_INDEX, OLD_INDEX]],
        ).fetchall()
    return dict(rows)


def recorded(url: str) -> list[int]:
    """[0017] once it is recorded (the migrations after it follow it), else []."""
    with psycopg.connect(url) as conn:
        query = "SELECT version FROM jobrunner_migrations WHERE version = %s"
        return [row[0] for row in conn.execute(query, [ALONE])]


def building(watcher: psycopg.Connection[Any]) -> int:
    """The pid of the backend building the index once it waits for an older writer, or 0."""
    row = watcher.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND query LIKE '%%CREATE UNIQUE INDEX CONCURRENTLY%%' AND wait_event_type = 'Lock'"
    ).fetchone()
    return row[0] if row else 0


def a_writer(url: str) -> psycopg.Connection[Any]:
    """A transaction that wrote to job_runs and stays open: a concurrent build waits for it."""
    writer = psycopg.connect(url)
    writer.execute("INSERT INTO job_runs (job_type) VALUES ('held')")
    return writer


def test_migrating_builds_the_new_index_while_job_runs_takes_writes(before_the_build):
    url = before_the_build
    writer = a_writer(url)
    # A build on a large table outlasts any statement_timeout meant for the runner's work.
    short = {"PGOPTIONS": "-c statement_timeout=500"}
    migrating = jobrunner_process("migrate", "--database-url", url, env=short)
    try:
        with psycopg.connect(url, autocommit=True) as watcher:
            wait_for(lambda: building(watcher), "the index build to wait for the open writer")
            # A plain CREATE INDEX would hold off every write until it was done.
            watcher.execute("SET lock_timeout = '1s'")
            watcher.execute("INSERT INTO job_runs (job_type, idempotency_key) VALUES ('t', 'L')")
            time.sleep(1)
    finally:
        writer.rollback()
        writer.close()
    _, stderr = migrating.communicate(timeout=60)

    assert migrating.returncode == 0, stderr
    assert "0017_idempotency_key_per_type_and_tenant" in stderr
    assert indexes(url) == {NEW_INDEX: True}
    assert recorded(url) == [ALONE]
    taken = run_cli(
        "enqueue", "t", "--tenant", "globex", "--idempotency-key", "K", "--database-url", url
    )
    assert taken.exit_code == 0, taken.stderr


def test_an_index_left_invalid_by_an_interrupted_build_is_built_again(before_the_build):
    url = before_the_build
    writer = a_writer(url)
    migrating = jobrunner_process("migrate", "--database-url", url)
    with psycopg.connect(url, autocommit=True) as watcher:
        pid = wait_for(lambda: building(watcher), "the index build to wait for the writer")
        watcher.execute("SELECT pg_cancel_backend(%s)", [pid])
    _, stderr = migrating.communicate(timeout=60)
    writer.rollback()
    writer.close()
    assert migrating.returncode == 1, stderr
    assert indexes(url) == {NEW_INDEX: False, OLD_INDEX: True}
    assert recorded(url) == []

    again = run_cli("migrate", "--database-url", url)

    assert again.exit_code == 0, again.stderr
    assert indexes(url) == {NEW_INDEX: True}
    assert recorded(url) == [ALONE]


def test_hosts_migrating_at_once_wait_for_the_one_building_the_index(before_the_build, tmp_path):
    url = before_the_build
    writer = a_writer(url)
    logs = [tmp_path / f"host-{n}.log" for n in range(3)]
    with contextlib.ExitStack() as files:
        hosts = [
            jobrunner_process(
                "migrate", "--database-url", url, stderr=files.enter_context(log.open("w"))
            )
            for log in logs
        ]

    def waited() -> list[str]:
        said = [log.read_text() for log in logs]
        return [err for err in said if "waiting for another host's migration" in err]

    try:
        with psycopg.connect(url, autocommit=True) as watcher:
            wait_for(lambda: building(watcher), "one host to build the index")
            # The build waits for the writer: the others find it going on, however long
            # they take to start.
            wait_for(lambda: len(waited()) >= 2, "the other hosts to wait for the build")
            assert [host.poll() for host in hosts] == [None, None, None]
            assert recorded(url) == []
    finally:
        writer.rollback()
        writer.close()
    codes = [host.wait(60) for host in hosts]

    assert codes == [0, 0, 0], [log.read_text() for log in logs]
    assert len(waited()) >= 2
    assert indexes(url) == {NEW_INDEX: True}
    assert recorded(url) == [ALONE]


def test_a_migration_building_an_index_shows_the_transaction_it_waits_for(before_the_build):
    url = before_the_build
    pending = sum(1 for m in shipped_migrations() if m.version >= ALONE)
    writer = a_writer(url)
    try:
        with OnTerminal("migrate", "--database-url", url) as terminal:
            terminal.wait_for(
                rf"0/{pending} migrations  0017: waiting for writers before build: pid "
                rf"{writer.info.backend_pid} \(idle in transaction, open \d"
            )
            writer.rollback()
            code, _ = terminal.finish()
    finally:
        writer.close()

    assert code == 0, terminal.screen
    assert indexes(url) == {NEW_INDEX: True}
    assert recorded(url) == [ALONE]


def test_ctrl_c_twice_stops_a_migration_at_once_and_the_next_one_builds_it(before_the_build):
    url = before_the_build
    writer = a_writer(url)
    try:
        with OnTerminal("migrate", "--database-url", url) as terminal:
            terminal.wait_for(r"0017: waiting for writers before build")
            terminal.type(b"\x03")
            terminal.wait_for(r"stopping after this step \(Ctrl-C again: at once\)")
            terminal.type(b"\x03")
            code, _ = terminal.finish()
    finally:
        writer.rollback()
        writer.close()

    assert code == 130, terminal.screen
    terminal.wait_for(r"jobrunner: stopped by SIGINT: 0 migration\(s\) applied; the rest are not")
    assert recorded(url) == []
    with OnTerminal("migrate", "--database-url", url) as again:
        assert again.finish()[0] == 0, again.screen
    assert indexes(url) == {NEW_INDEX: True}
    assert recorded(url) == [ALONE]
