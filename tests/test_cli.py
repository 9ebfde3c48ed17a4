"""The command line, exercised as users type it: exit codes, stdout, stderr."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta

import psycopg
import pytest

from tests.conftest import ROOT, count, jobrunner_process, run_cli
from tests.factories import insert_run, now

HANDLERS = "tests.handlers.basic"


def test_enqueue_prints_the_run_id_alone_on_stdout(db_url, conn):
    result = run_cli("enqueue", "test.ok", "--payload", '{"a": 1}', "--database-url", db_url)
    assert result.exit_code == 0, result.stderr
    run_id = int(result.stdout)
    assert result.stdout == f"{run_id}\n"
    row = conn.execute("SELECT job_type, payload, status FROM job_runs WHERE id = %s", [run_id])
    assert row.fetchone() == ("test.ok", {"a": 1}, "queued")


def test_enqueue_reads_the_url_from_the_environment(db_url, conn):
    result = run_cli("enqueue", "test.ok", env={"JOBRUNNER_DATABASE_URL": db_url})
    assert result.exit_code == 0, result.stderr
    assert count(conn, "SELECT count(*) FROM job_runs") == 1


def test_enqueue_options_are_stored(db_url, conn):
    result = run_cli(
        "enqueue",
        "test.ok",
        "--database-url",
        db_url,
        "--delay",
        "5m",
        "--max-attempts",
        "7",
        "--priority",
        "-3",
        "--tenant",
        "acme",
        "--idempotency-key",
        "k-1",
    )
    assert result.exit_code == 0, result.stderr
    row = conn.execute(
        "SELECT max_attempts, priority, tenant_id, idempotency_key, run_at - created_at"
        " FROM job_runs"
    ).fetchone()
    assert row[:4] == (7, -3, "acme", "k-1")
    assert row[4] == timedelta(minutes=5)


def test_enqueue_run_at_is_stored_as_given(db_url, conn):
    result = run_cli(
        "enqueue", "test.ok", "--database-url", db_url, "--run-at", "2030-01-05T09:00:00+01:00"
    )
    assert result.exit_code == 0, result.stderr
    [run_at] = conn.execute("SELECT run_at AT TIME ZONE 'UTC' FROM job_runs").fetchone()
    assert run_at.isoformat() == "2030-01-05T08:00:00"


def test_enqueue_payload_file_and_stdin(db_url, conn, tmp_path):
    path = tmp_path / "payload.json"
    path.write_text('{"from": "file"}')
    first = run_cli("enqueue", "test.ok", "--payload-file", str(path), "--database-url", db_url)
    second = run_cli(
        "enqueue",
        "test.ok",
        "--payload-file",
        "-",
        "--database-url",
        db_url,
        input='{"from": "stdin"}',
    )
    assert (first.exit_code, second.exit_code) == (0, 0)
    payloads = [r[0] for r in conn.execute("SELECT payload FROM job_runs ORDER BY id")]
    assert payloads == [{"from": "file"}, {"from": "stdin"}]


def test_an_existing_idempotency_key_prints_the_existing_id_and_exits_0(db_url, conn):
    args = ("enqueue", "test.ok", "--idempotency-key", "weekly:1", "--database-url", db_url)
    first, second = run_cli(*args), run_cli(*args)
    assert (first.exit_code, second.exit_code) == (0, 0)
    assert first.stdout == second.stdout
    assert count(conn, "SELECT count(*) FROM job_runs") == 1


def test_enqueue_jsonl_enqueues_every_line_and_prints_one_id_a_line(db_url, conn):
    lines = [
        json.dumps({"type": "test.ok", "payload": {"i": i}, "priority": i % 3}) for i in range(500)
    ]
    lines.insert(10, "")  # blank lines are skipped
    lines.append(json.dumps({"type": "test.ok", "idempotency_key": "once", "delay": "1h"}))
    lines.append(json.dumps({"type": "test.ok", "idempotency_key": "once"}))
    result = run_cli("enqueue", "--jsonl", "-", "--database-url", db_url, input="\n".join(lines))
    assert result.exit_code == 0, result.stderr
    ids = [int(x) for x in result.stdout.split()]
    assert len(ids) == 502 and ids[-1] == ids[-2]
    assert count(conn, "SELECT count(*) FROM job_runs") == 501
    assert conn.execute("SELECT payload FROM job_runs WHERE id = %s", [ids[7]]).fetchone()[0] == {
        "i": 7
    }


def test_jsonl_with_one_bad_line_writes_nothing(db_url, conn):
    lines = [json.dumps({"type": "test.ok"})] * 100 + ['{"type": "test.ok", "delay": "soon"}']
    result = run_cli("enqueue", "--jsonl", "-", "--database-url", db_url, input="\n".join(lines))
    assert result.exit_code == 2
    assert "line 101" in result.stderr and "soon" in result.stderr
    assert count(conn, "SELECT count(*) FROM job_runs") == 0


def test_tick_runs_due_work_and_logs_one_event_per_outcome(db_url, conn):
    for _ in range(3):
        run_cli("enqueue", "test.ok", "--database-url", db_url)
    run_cli("enqueue", "test.give_up", "--database-url", db_url)
    result = run_cli("tick", "--database-url", db_url, "--handlers", HANDLERS, "--json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["claimed"], summary["succeeded"], summary["dead"]) == (4, 3, 1)
    events = [json.loads(line) for line in result.stderr.splitlines()]
    outcomes = [e for e in events if e["event"] == "run finished"]
    assert sorted(e["outcome"] for e in outcomes) == ["dead", "succeeded", "succeeded", "succeeded"]
    assert all({"job_type", "run_id", "attempt", "duration_ms"} <= e.keys() for e in outcomes)
    [finished] = [e for e in events if e["event"] == "tick finished"]
    assert finished["succeeded"] == 3


def test_tick_types_narrows_what_is_claimed(db_url, conn):
    run_cli("enqueue", "test.ok", "--database-url", db_url)
    run_cli("enqueue", "test.give_up", "--database-url", db_url)
    result = run_cli(
        "tick", "--database-url", db_url, "--handlers", HANDLERS, "--types", "test.ok", "--json"
    )
    assert json.loads(result.stdout)["claimed"] == 1
    assert count(conn, "SELECT count(*) FROM job_runs WHERE status = 'queued'") == 1


def test_tick_with_a_type_that_has_no_handler_is_bad_usage(db_url):
    result = run_cli("tick", "--database-url", db_url, "--handlers", HANDLERS, "--types", "nope")
    assert result.exit_code == 2
    assert "nope" in result.stderr


def test_handlers_load_from_the_environment(db_url, conn):
    run_cli("enqueue", "test.ok", "--database-url", db_url)
    result = run_cli("tick", "--database-url", db_url, env={"JOBRUNNER_HANDLERS": HANDLERS})
    assert result.exit_code == 0, result.stderr
    assert count(conn, "SELECT count(*) FROM job_runs WHERE status = 'succeeded'") == 1


def test_a_handler_module_that_fails_to_import_is_exit_2_without_traceback(db_url):
    result = run_cli("tick", "--database-url", db_url, "--handlers", "tests.handlers.broken_import")
    assert result.exit_code == 2
    assert "tests.handlers.broken_import" in result.stderr
    assert "not installed" in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_missing_handler_module_is_exit_2(db_url):
    result = run_cli("tick", "--database-url", db_url, "--handlers", "no_such_module_xyz")
    assert result.exit_code == 2
    assert "no_such_module_xyz" in result.stderr


def test_show_explains_a_dead_run_with_its_history(db_url):
    run_id = run_cli("enqueue", "test.fail", "--max-attempts", "1", "--database-url", db_url)
    run_cli("tick", "--database-url", db_url, "--handlers", HANDLERS)
    result = run_cli("show", run_id.stdout.strip(), "--database-url", db_url)
    assert result.exit_code == 0, result.stderr
    assert "dead" in result.stdout and "RuntimeError: boom" in result.stdout
    shown = json.loads(
        run_cli("show", run_id.stdout.strip(), "--json", "--database-url", db_url).stdout
    )
    assert shown["status"] == "dead" and shown["attempts"] == 1
    assert [a["error_type"] for a in shown["attempt_history"]] == ["RuntimeError"]


def test_show_retry_cancel_of_an_unknown_run_exit_1(db_url):
    for command in ("show", "retry", "cancel"):
        result = run_cli(command, "424242", "--database-url", db_url)
        assert result.exit_code == 1, command
        assert "424242 not found" in result.stderr


def test_cancel_of_a_finished_run_exits_1_with_the_reason(db_url):
    run_id = run_cli("enqueue", "test.ok", "--database-url", db_url).stdout.strip()
    run_cli("tick", "--database-url", db_url, "--handlers", HANDLERS)
    result = run_cli("cancel", run_id, "--database-url", db_url)
    assert result.exit_code == 1
    assert f"cannot cancel run {run_id}: it is succeeded" in result.stderr


def test_cancel_and_retry_take_several_ids(db_url, conn):
    ids = [run_cli("enqueue", "test.ok", "--database-url", db_url).stdout.strip() for _ in range(3)]
    result = run_cli("cancel", *ids, "--database-url", db_url)
    assert result.exit_code == 0
    assert result.stdout.split("\n")[:3] == [f"cancelled {i}" for i in ids]
    result = run_cli("retry", *ids, "--database-url", db_url)
    assert result.exit_code == 0
    assert count(conn, "SELECT count(*) FROM job_runs WHERE status = 'queued'") == 3


def test_list_filters_by_status_and_type(db_url):
    run_cli("enqueue", "test.ok", "--database-url", db_url)
    run_cli("enqueue", "test.give_up", "--database-url", db_url)
    run_cli("tick", "--database-url", db_url, "--handlers", HANDLERS)
    listed = json.loads(
        run_cli("list", "--status", "dead", "--json", "--database-url", db_url).stdout
    )
    assert [r["job_type"] for r in listed] == ["test.give_up"]
    listed = json.loads(
        run_cli("list", "--type", "test.ok", "--json", "--database-url", db_url).stdout
    )
    assert [r["status"] for r in listed] == ["succeeded"]


def test_every_command_refuses_a_database_without_the_schema(empty_database_url):
    for args in (
        ["tick", "--handlers", HANDLERS],
        ["enqueue", "test.ok"],
        ["show", "1"],
        ["list"],
        ["retry", "1"],
        ["cancel", "1"],
    ):
        result = run_cli(*args, "--database-url", empty_database_url)
        assert result.exit_code == 1, args
        assert "run `jobrunner migrate`" in result.stderr, args


def test_an_outdated_schema_is_refused(db_url, conn):
    [(version, name)] = conn.execute(
        "DELETE FROM jobrunner_migrations WHERE version ="
        " (SELECT max(version) FROM jobrunner_migrations) RETURNING version, name"
    ).fetchall()
    [previous] = conn.execute("SELECT max(version) FROM jobrunner_migrations").fetchone()
    try:
        result = run_cli("list", "--database-url", db_url)
        assert result.exit_code == 1
        assert f"at version {previous}" in result.stderr
        assert "run `jobrunner migrate`" in result.stderr
    finally:
        conn.execute(
            "INSERT INTO jobrunner_migrations (version, name) VALUES (%s, %s)", [version, name]
        )


def test_migrate_from_four_hosts_at_once_succeeds(empty_database_url):
    from cronjob.migrate import shipped_migrations

    url = empty_database_url
    procs = [jobrunner_process("migrate", "--database-url", url) for _ in range(4)]
    results = [(p.wait(timeout=60), p.stderr.read()) for p in procs]
    assert [code for code, _ in results] == [0, 0, 0, 0], results
    with psycopg.connect(url) as c:
        versions = [r[0] for r in c.execute("SELECT version FROM jobrunner_migrations")]
    assert sorted(versions) == [m.version for m in shipped_migrations()]
    assert run_cli("list", "--database-url", url).exit_code == 0


def test_a_database_migrated_when_0008_was_the_last_migration_upgrades(empty_database_url):
    # A migration's text never changes once shipped: a database that applied it never runs
    # it again, so whatever a later migration needs (the search_path pinning function,
    # made in 0010) must come from a later migration.
    from cronjob import store
    from cronjob.migrate import shipped_migrations

    url = empty_database_url
    with psycopg.connect(url, autocommit=True) as c, c.transaction():
        store.migrations_create_table(c)
        for m in shipped_migrations():
            if m.version <= 8:
                store.migration_apply(c, m.path.read_text(), m.version, m.name)

    result = run_cli("migrate", "--database-url", url)

    assert result.exit_code == 0, result.output
    with psycopg.connect(url) as c:
        unpinned = c.execute(
            "SELECT proname FROM pg_proc WHERE proname LIKE 'jobrunner%%'"
            " AND NOT coalesce(proconfig::text LIKE '%%search_path%%', false)"
        ).fetchall()
    assert unpinned == []


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app:s3cr3t-pw@127.0.0.1:1/app",
        "host=127.0.0.1 port=1 user=app password=s3cr3t-pw dbname=app",
    ],
)
def test_an_unreachable_database_is_exit_1_without_the_password(url):
    result = run_cli("list", "--database-url", url)
    assert result.exit_code == 1
    assert "s3cr3t-pw" not in result.stderr + result.stdout
    assert "cannot connect" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_url_libpq_cannot_read_is_refused_alike_by_both_connects_without_its_password():
    import asyncio

    from cronjob.db import connect, connect_async
    from cronjob.errors import DatabaseUnavailable

    url = "postgresql://app:s3cr3t%zz@127.0.0.1:1/app"  # libpq quotes the token it chokes on
    messages = []
    for attempt in (lambda: connect(url), lambda: asyncio.run(connect_async(url))):
        with pytest.raises(DatabaseUnavailable) as refused:
            attempt()
        messages.append(str(refused.value))
    assert messages[0] == messages[1]
    assert "invalid database URL" in messages[0] and "s3cr3t" not in messages[0]


def test_help_is_available_for_every_command():
    from cronjob.cli import COMMANDS

    for name in COMMANDS:
        result = run_cli(name, "--help")
        assert result.exit_code == 0, name
        assert "Usage:" in result.stdout


def listed_commands(help_text: str) -> list[str]:
    """The command names a group's --help lists."""
    section = help_text.split("\nCommands:\n", 1)[1]
    return [line.split()[0] for line in section.splitlines() if line.startswith("  ")]


def test_help_outside_a_django_project_lists_schedule_sync_and_not_djangos_sync():
    import importlib.util

    listed = listed_commands(run_cli("--help").stdout)
    assert "schedule" in listed and "sync" not in listed
    if importlib.util.find_spec("django") is None:
        # The variable alone makes no Django project: a shell may export it for another app.
        with_variable = run_cli("--help", env={"DJANGO_SETTINGS_MODULE": "project.settings"})
        assert "sync" not in listed_commands(with_variable.stdout)


def test_djangos_sync_outside_a_django_project_says_what_it_needs_in_one_line(db_url, conn):
    import importlib.util

    result = run_cli("sync", "--database-url", db_url)
    assert result.exit_code == 2
    needs = (
        "DJANGO_SETTINGS_MODULE set"
        if importlib.util.find_spec("django")
        else "the django extra: pip install 'pg-jobrunner[django]'"
    )
    assert result.stderr == f"jobrunner: error: sync reads Django's settings: it needs {needs}\n"
    assert run_cli("sync", "--help").exit_code == 0
    assert count(conn, "SELECT count(*) FROM job_definitions") == 0


# Every command that runs no handler, with arguments that succeed once a run (id 1) and
# a schedule (nightly) exist.
OPERATOR_COMMANDS = {
    "enqueue": ["enqueue", "test.ok"],
    "retry": ["retry", "1"],
    "cancel": ["cancel", "1"],
    "list": ["list"],
    "show": ["show", "1"],
    "status": ["status"],
    "metrics": ["metrics"],
    "check": ["check", "--max-dead", "0"],
    "prune": ["prune", "--older-than", "1d"],
    "schedule add": ["schedule", "add", "hourly", "--cron", "@hourly", "--type", "test.ok"],
    "schedule list": ["schedule", "list"],
    "schedule show": ["schedule", "show", "nightly"],
    "schedule pause": ["schedule", "pause", "nightly"],
    "schedule resume": ["schedule", "resume", "nightly"],
    "schedule remove": ["schedule", "remove", "nightly"],
    "schedule sync": ["schedule", "sync", "-"],
    "migrate": ["migrate"],
    "retry by filter": ["retry", "--type", "test.ok", "--yes"],
    "cancel by filter": ["cancel", "--type", "test.ok", "--dry-run"],
    "pause": ["pause", "test.ok", "--reason", "deploy"],
    "resume": ["resume", "test.ok"],
    "audit": ["audit", "--since", "1h"],
}
SYNC_FILE = '[schedules.nightly]\ncron = "0 3 * * *"\ntype = "test.ok"\n'


@pytest.mark.parametrize("command", OPERATOR_COMMANDS)
def test_operator_commands_work_when_a_handler_module_fails_to_import(db_url, command):
    # Repairing what a broken deploy left behind must not depend on the broken module.
    assert run_cli("enqueue", "test.ok", "--database-url", db_url).stdout == "1\n"
    added = ("schedule", "add", "nightly", "--cron", "0 3 * * *", "--type", "test.ok")
    assert run_cli(*added, "--database-url", db_url).exit_code == 0
    result = run_cli(
        *OPERATOR_COMMANDS[command],
        input=SYNC_FILE,
        env={"JOBRUNNER_DATABASE_URL": db_url, "JOBRUNNER_HANDLERS": "no_such_module_xyz"},
    )
    assert result.exit_code == 0, result.stderr
    assert "no_such_module_xyz" not in result.stderr


@pytest.mark.parametrize("command", OPERATOR_COMMANDS)
def test_operator_commands_take_no_handlers_option(command):
    result = run_cli(*OPERATOR_COMMANDS[command], "--handlers", "tests.handlers.basic")
    assert result.exit_code == 2
    assert "No such option '--handlers'" in result.stderr


def test_only_the_commands_that_run_handlers_offer_the_handlers_option():
    from cronjob.cli import COMMANDS

    offering = [name for name in COMMANDS if "--handlers" in run_cli(name, "--help").stdout]
    assert offering == ["tick", "demo"]


# What a tick that finds nothing to do may import, cron minute after cron minute.
# A module added here is a cost every host pays every minute: import it where it is used.
IDLE_TICK_MODULES = [
    "cronjob",
    "cronjob.cli",
    "cronjob.commands",
    "cronjob.commands.tick",
    "cronjob.db",
    "cronjob.errors",
    "cronjob.handlers",
    "cronjob.inputs",
    "cronjob.location",
    "cronjob.log",
    "cronjob.queries",
    "cronjob.queries.preflight",
    "cronjob.report",
    "cronjob.schema",
    "cronjob.settings",
    "cronjob.store",
    "cronjob.store.preflight",
    "cronjob.text",
    "cronjob.tick",  # the story (run_tick) alone: its parts load only when there is work
]


def test_an_idle_tick_asks_one_question_and_imports_no_tick_machinery(db_url, conn):
    insert_run(conn, run_at=now("1 hour"))
    code = (
        "import json, sys\n"
        "from cronjob.cli import main\n"
        "try:\n"
        f"    main(['tick', '--database-url', {db_url!r}, '--handlers', {HANDLERS!r}])\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code\n"
        "ours = sorted(m for m in sys.modules if m.startswith('cronjob'))\n"
        "# Loaded when something happens: the cron library, the logging library.\n"
        "theirs = sorted(m for m in sys.modules if m.startswith(('croniter', 'structlog')))\n"
        "print(json.dumps([ours, theirs]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    ours, theirs = json.loads(result.stdout)
    assert ours == IDLE_TICK_MODULES
    assert theirs == []
    [finished] = [json.loads(x) for x in result.stderr.splitlines() if "tick finished" in x]
    assert finished["claimed"] == 0


def test_a_tick_leaves_its_heap_to_the_system_at_exit_after_writing_everything(db_url):
    code = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('frozen at exit:', gc.get_freeze_count() > 0))\n"
        "from cronjob.cli import main\n"
        f"main(['tick', '--database-url', {db_url!r}, '--handlers', {HANDLERS!r}, '--json'])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    summary, frozen = result.stdout.splitlines()
    assert json.loads(summary)["claimed"] == 0
    assert frozen == "frozen at exit: True"
    assert "tick finished" in result.stderr


def test_a_tick_with_only_an_expired_lease_to_rescue_does_the_full_tick(db_url, conn):
    insert_run(
        conn,
        "other.type",
        status="running",
        max_attempts=5,
        locked_until=now("-1 second"),
        locked_by="gone:1",
        started_at=now("-1 minute"),
    )
    result = run_cli("tick", "--database-url", db_url, "--handlers", HANDLERS, "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["rescued"] == 1


def test_a_busy_tick_keeps_what_it_loaded_out_of_the_cyclic_collector(db_url, conn):
    import gc

    insert_run(conn)
    gc.unfreeze()
    try:
        result = run_cli("tick", "--database-url", db_url, "--handlers", HANDLERS)
        assert result.exit_code == 0, result.stderr
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
