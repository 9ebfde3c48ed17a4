"""Driver errors become the project's own in one guard, `cronjob.db.database_errors`."""

from __future__ import annotations

import psycopg
import pytest

from cronjob.db import database_errors
from cronjob.errors import DatabaseError, DatabaseInterrupted
from cronjob.schema import latest_shipped_version
from tests.conftest import run_cli


def test_a_statement_the_server_cancels_is_database_interrupted(conn):
    conn.execute("SET statement_timeout = '10ms'")
    with pytest.raises(DatabaseInterrupted) as raised, database_errors():
        conn.execute("SELECT pg_sleep(1)")
    assert isinstance(raised.value.__cause__, psycopg.errors.QueryCanceled)
    assert raised.value.sqlstate == "57014"
    assert str(raised.value) == f"database: {raised.value.description}"
    assert "statement timeout" in raised.value.description


def test_a_refused_statement_is_a_database_error_with_its_code_and_one_line(conn):
    with pytest.raises(DatabaseError) as raised, database_errors():
        conn.execute("SELECT * FROM no_such_table")
    assert not isinstance(raised.value, DatabaseInterrupted)
    assert raised.value.sqlstate == "42P01"
    assert raised.value.primary == 'relation "no_such_table" does not exist'
    assert "\n" not in raised.value.description
    assert raised.value.description.startswith(raised.value.primary)


def test_errors_chosen_to_pass_propagate_untranslated(conn):
    conn.execute("SET statement_timeout = '10ms'")
    with (
        pytest.raises(psycopg.errors.QueryCanceled),
        database_errors(passing=(psycopg.errors.QueryCanceled,)),
    ):
        conn.execute("SELECT pg_sleep(1)")


def test_a_password_in_a_driver_message_never_reaches_the_project_error():
    with pytest.raises(DatabaseInterrupted) as raised, database_errors():
        raise psycopg.OperationalError("connection to postgresql://app:s3cr3t-pw@db/app failed")
    assert "s3cr3t-pw" not in str(raised.value)
    assert raised.value.sqlstate is None


def test_errors_that_are_not_the_drivers_are_left_alone():
    with pytest.raises(ValueError), database_errors():
        raise ValueError("not a database problem")


def test_a_database_error_in_a_command_is_one_line_and_exit_1(empty_database_url):
    # The schema claims to be current but its tables are missing: the command's own
    # statement fails, past every check made before it.
    with psycopg.connect(empty_database_url, autocommit=True) as c:
        c.execute("CREATE TABLE jobrunner_migrations (version int, name text)")
        c.execute("INSERT INTO jobrunner_migrations VALUES (%s, 'x')", [latest_shipped_version()])
    result = run_cli("list", "--database-url", empty_database_url)
    assert result.exit_code == 1
    [line] = result.stderr.strip().splitlines()
    assert line.startswith('jobrunner: error: database: relation "job_runs" does not exist')
