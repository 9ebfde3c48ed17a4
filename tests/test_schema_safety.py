"""The schema's own functions do what they say whatever the caller's search_path."""

from __future__ import annotations

from tests.conftest import count
from tests.factories import insert_run


def test_deleting_a_definition_unlinks_its_runs_whatever_the_search_path(conn):
    conn.execute(
        "INSERT INTO job_definitions (name, job_type, schedule) VALUES ('d', 't', '* * * * *')"
    )
    insert_run(conn, "t", definition_id=1)
    # A schema of the caller's own, searched first, with a job_runs of its own.
    conn.execute("DROP SCHEMA IF EXISTS decoy CASCADE")
    conn.execute("CREATE SCHEMA decoy")
    try:
        conn.execute("CREATE TABLE decoy.job_runs (definition_id bigint)")
        conn.execute("INSERT INTO decoy.job_runs VALUES (1)")
        conn.execute("SET search_path = decoy, public")
        conn.execute("DELETE FROM public.job_definitions WHERE name = 'd'")
        conn.execute("RESET search_path")

        assert count(conn, "SELECT count(*) FROM job_runs WHERE definition_id IS NOT NULL") == 0
        assert count(conn, "SELECT count(*) FROM decoy.job_runs WHERE definition_id = 1") == 1
    finally:
        conn.execute("RESET search_path")
        conn.execute("DROP SCHEMA decoy CASCADE")


def test_every_function_jobrunner_installs_pins_its_search_path_with_pg_temp_last(conn):
    functions = conn.execute(
        "SELECT p.proname, p.proconfig FROM pg_proc p"
        " JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = current_schema() AND p.proname LIKE 'jobrunner%%'"
    ).fetchall()
    assert functions
    for name, config in functions:
        [path] = [c for c in config or [] if c.startswith("search_path=")]
        assert path == "search_path=public, pg_temp", name
