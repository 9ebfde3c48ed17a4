"""`jobrunner schedule ...` as users type it: definitions, validation, sync plans, preview."""

from __future__ import annotations

import json
import re
import threading
import time
from datetime import datetime, timedelta
from itertools import pairwise

import psycopg
import pytest

from cronjob import definitions
from tests.conftest import count, run_cli
from tests.factories import insert_run, now

HANDLERS = "tests.handlers.basic"
ISO_WITH_OFFSET = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d")


def schedule(db_url: str, *args: str, input: str | None = None):
    return run_cli("schedule", *args, "--database-url", db_url, input=input)


def add(db_url: str, name: str, *args: str):
    result = schedule(db_url, "add", name, *args)
    assert result.exit_code == 0, result.stderr
    return result


def _definition_id(conn, name: str) -> int:
    return conn.execute("SELECT id FROM job_definitions WHERE name = %s", [name]).fetchone()[0]


def make_due(conn) -> None:
    """Move every `*/5` definition back an hour, as if no tick had run since."""
    conn.execute(
        "UPDATE job_definitions SET"
        " materialized_through = date_trunc('hour', now()) - interval '1 hour',"
        " next_fire_at = date_trunc('hour', now()) - interval '55 minutes'"
    )


# -- add, list, show ---------------------------------------------------------------


def test_add_stores_the_definition_and_prints_its_next_run(db_url, conn):
    result = add(
        db_url,
        "nightly-report",
        "--cron",
        "30 2 * * *",
        "--type",
        "reports.nightly",
        "--timezone",
        "Europe/Amsterdam",
        "--payload",
        '{"format": "pdf"}',
        "--max-attempts",
        "5",
        "--priority",
        "-1",
        "--catch-up",
        "all",
        "--catch-up-limit",
        "3",
    )
    next_run = result.stdout.strip().rsplit(" ", 1)[-1]
    assert result.stdout.startswith("added schedule nightly-report: next run ")
    assert ISO_WITH_OFFSET.fullmatch(next_run) and next_run[11:19] == "02:30:00"
    row = conn.execute(
        "SELECT job_type, payload, schedule, timezone, scope, max_attempts, priority, catch_up,"
        " catch_up_limit, enabled, materialized_through = created_at,"
        " next_fire_at > materialized_through FROM job_definitions"
    ).fetchone()
    assert row == (
        "reports.nightly",
        {"format": "pdf"},
        "30 2 * * *",
        "Europe/Amsterdam",
        "global",
        5,
        -1,
        "all",
        3,
        True,
        True,
        True,
    )


def test_add_keeps_the_users_alias_and_defaults(db_url, conn):
    add(db_url, "hourly", "--cron", "  @hourly ", "--type", "t")
    row = conn.execute(
        "SELECT schedule, timezone, scope, max_attempts, priority, catch_up, payload"
        " FROM job_definitions"
    ).fetchone()
    assert row == ("@hourly", "UTC", "global", None, 0, "latest", {})


def test_adding_an_existing_name_is_exit_1(db_url, conn):
    add(db_url, "hourly", "--cron", "@hourly", "--type", "t")
    result = schedule(db_url, "add", "hourly", "--cron", "@daily", "--type", "t")
    assert result.exit_code == 1
    assert "schedule 'hourly' already exists" in result.stderr
    assert conn.execute("SELECT schedule FROM job_definitions").fetchone() == ("@hourly",)


BAD_ADDS = {
    "never fires": (["--cron", "0 0 31 2 *"], "never fires"),
    "six fields": (["--cron", "0 0 0 * * *"], "seconds and years are not supported"),
    # croniter reads these (Quartz and Jenkins extensions); cron does not.
    "last day": (["--cron", "0 0 L * *"], "day-of-month value 'L' is not a number"),
    "nearest weekday": (["--cron", "0 0 15W * *"], "day-of-month value '15W'"),
    "nth weekday": (["--cron", "0 0 * * 5#3"], "day-of-week value '5#3'"),
    "hashed": (["--cron", "H * * * *"], "minute value 'H'"),
    "question mark": (["--cron", "0 0 ? * *"], "day-of-month value '?'"),
    "wrap-around": (["--cron", "0 0 * * fri-mon"], "cron spells it 'fri-7,mon'"),
    "out of range": (["--cron", "61 * * * *"], "minute value 61 out of range"),
    "unknown alias": (["--cron", "@fortnightly"], "unknown cron alias"),
    "reboot": (["--cron", "@reboot"], "'@reboot'"),
    "unknown timezone": (["--timezone", "Mars/Base"], "unknown timezone 'Mars/Base'"),
    "bad scope": (["--scope", "everyone"], "--scope"),
    "bad policy": (["--catch-up", "sometimes"], "--catch-up"),
    "bad overlap": (["--overlap", "never"], "--overlap"),
    "limit without all": (["--catch-up-limit", "5"], "catch-up policy 'all' only"),
    "zero limit": (["--catch-up", "all", "--catch-up-limit", "0"], "catch-up limit"),
    "huge limit": (["--catch-up", "all", "--catch-up-limit", "100000"], "catch-up limit"),
    "bad payload": (["--payload", "{nope"], "invalid JSON"),
    "zero attempts": (["--max-attempts", "0"], "max attempts"),
    "word priority": (["--priority", "high"], "priority"),
    "empty type": (["--type", ""], "job type"),
}


@pytest.mark.parametrize(("args", "message"), BAD_ADDS.values(), ids=BAD_ADDS.keys())
def test_bad_definitions_are_one_line_exit_2_and_write_nothing(db_url, conn, args, message):
    defaults = {"--cron": "*/5 * * * *", "--type": "t"}
    given = dict(zip(args[::2], args[1::2], strict=True))
    full = [item for key, value in {**defaults, **given}.items() for item in (key, value)]
    result = schedule(db_url, "add", "some-name", *full)
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert result.stdout == ""
    assert count(conn, "SELECT count(*) FROM job_definitions") == 0


@pytest.mark.parametrize("name", ["bad name", "", ".leading-dot", "x" * 201, "tab\tname"])
def test_bad_names_are_refused(db_url, conn, name):
    result = schedule(db_url, "add", name, "--cron", "@daily", "--type", "t")
    assert result.exit_code == 2
    assert "invalid schedule name" in result.stderr
    assert count(conn, "SELECT count(*) FROM job_definitions") == 0


def test_list_shows_every_schedule_with_its_next_run(db_url):
    add(db_url, "b-daily", "--cron", "@daily", "--type", "t", "--timezone", "Asia/Tokyo")
    tenant = add(db_url, "a-hourly", "--cron", "0 * * * *", "--type", "t", "--scope", "tenant")
    assert "ticks materialize a tenant-scoped schedule only with a tenant query" in tenant.stderr
    schedule(db_url, "pause", "b-daily")
    lines = schedule(db_url, "list").stdout.splitlines()
    header = ["NAME", "SCHEDULE", "TIMEZONE", "SCOPE", "OVERLAP", "TYPE", "NEXT", "RUN"]
    assert lines[0].split() == header
    assert lines[1].split()[:1] + lines[1].split()[-5:-1] == [
        "a-hourly",
        "UTC",
        "tenant",
        "allow",
        "t",
    ]
    assert ISO_WITH_OFFSET.fullmatch(lines[1].split()[-1])
    assert lines[2].split() == ["b-daily", "@daily", "Asia/Tokyo", "global", "allow", "t", "paused"]


def test_list_json_gives_every_field(db_url):
    add(db_url, "hourly", "--cron", "@hourly", "--type", "t", "--payload", '{"a": [1]}')
    [listed] = json.loads(schedule(db_url, "list", "--json").stdout)
    assert {
        k: listed[k]
        for k in (
            "name",
            "type",
            "cron",
            "timezone",
            "scope",
            "payload",
            "catch_up",
            "overlap",
            "overlap_skips",
            "enabled",
        )
    } == {
        "name": "hourly",
        "type": "t",
        "cron": "@hourly",
        "timezone": "UTC",
        "scope": "global",
        "payload": {"a": [1]},
        "catch_up": "latest",
        "overlap": "allow",
        "overlap_skips": 0,
        "enabled": True,
    }
    next_fire = datetime.fromisoformat(listed["next_fire_at"])
    assert next_fire.minute == 0 and next_fire > datetime.fromisoformat(listed["created_at"])


def test_list_with_no_schedules_says_so(db_url):
    result = schedule(db_url, "list")
    assert result.exit_code == 0 and "No schedules" in result.stdout
    assert json.loads(schedule(db_url, "list", "--json").stdout) == []


def test_show_gives_next_fire_times_the_mark_and_recent_runs(db_url, conn):
    add(
        db_url,
        "every5",
        "--cron",
        "*/5 * * * *",
        "--type",
        "test.ok",
        "--timezone",
        "America/New_York",
    )
    make_due(conn)
    tick = run_cli("tick", "--database-url", db_url, "--handlers", HANDLERS)
    assert tick.exit_code == 0, tick.stderr
    shown = json.loads(schedule(db_url, "show", "every5", "--json").stdout)
    upcoming = [datetime.fromisoformat(t) for t in shown["upcoming"]]
    assert len(upcoming) == 5
    assert all(b - a == timedelta(minutes=5) for a, b in pairwise(upcoming))
    assert all(t.utcoffset() in (timedelta(hours=-4), timedelta(hours=-5)) for t in upcoming)
    assert shown["run_counts"] == {"succeeded": 1}
    [run] = shown["recent_runs"]
    assert run["status"] == "succeeded" and run["tenant_id"] is None
    assert datetime.fromisoformat(run["scheduled_for"]) == datetime.fromisoformat(
        shown["materialized_through"]
    )
    text = schedule(db_url, "show", "every5").stdout
    assert "next runs" in text and "recent runs:" in text and "1 succeeded" in text


# -- pause, resume, remove ------------------------------------------------------------


def test_pause_and_resume(db_url, conn):
    add(db_url, "hourly", "--cron", "@hourly", "--type", "t")
    assert schedule(db_url, "pause", "hourly").stdout == "paused hourly\n"
    assert schedule(db_url, "pause", "hourly").stdout == "hourly was already paused\n"
    assert conn.execute("SELECT enabled FROM job_definitions").fetchone() == (False,)
    conn.execute("UPDATE job_definitions SET materialized_through = now() - interval '1 day'")
    resumed = schedule(db_url, "resume", "hourly")
    assert resumed.stdout.startswith("resumed hourly: next run ")
    row = conn.execute(
        "SELECT enabled, materialized_through > now() - interval '1 minute' FROM job_definitions"
    ).fetchone()
    assert row == (True, True)  # resuming starts afresh: the paused day is not made up
    assert schedule(db_url, "resume", "hourly").stdout == "hourly was not paused\n"


def test_remove_deletes_the_definition_and_keeps_its_runs(db_url, conn):
    add(db_url, "hourly", "--cron", "@hourly", "--type", "t")
    insert_run(conn, "t", definition_id=_definition_id(conn, "hourly"), scheduled_for=now())
    assert schedule(db_url, "remove", "hourly").stdout == "removed hourly\n"
    assert count(conn, "SELECT count(*) FROM job_definitions") == 0
    assert count(conn, "SELECT count(*) FROM job_runs WHERE definition_id IS NULL") == 1


def test_removing_a_definition_while_a_tick_materializes_it_leaves_no_run_linked_to_it(
    db_url, conn
):
    add(db_url, "hourly", "--cron", "@hourly", "--type", "t")
    [definition_id] = conn.execute("SELECT id FROM job_definitions").fetchone()
    removed: list[Exception | None] = []

    def remove() -> None:
        with psycopg.connect(db_url, autocommit=True) as other:
            try:
                definitions.remove(other, "hourly")
                removed.append(None)
            except Exception as exc:
                removed.append(exc)

    with psycopg.connect(db_url) as tick:
        # What materializing does: lock the definition, then write its runs.
        tick.execute("SELECT 1 FROM job_definitions WHERE id = %s FOR UPDATE", [definition_id])
        tick.execute(
            "INSERT INTO job_runs (definition_id, job_type, scheduled_for)"
            " SELECT %s, 't', now() + i * interval '1 hour' FROM generate_series(1, 3) i",
            [definition_id],
        )
        remover = threading.Thread(target=remove)
        remover.start()
        deadline = time.monotonic() + 10
        while not count(
            conn, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        ):
            assert time.monotonic() < deadline, "the removal never waited for the tick's lock"
            time.sleep(0.01)
        tick.commit()
    remover.join(10)

    assert removed == [None]
    assert count(conn, "SELECT count(*) FROM job_definitions") == 0
    assert count(conn, "SELECT count(*) FROM job_runs WHERE definition_id IS NULL") == 3


def test_a_definition_deleted_in_plain_sql_leaves_its_runs_unlinked(db_url, conn):
    add(db_url, "hourly", "--cron", "@hourly", "--type", "t")
    insert_run(conn, "t", definition_id=_definition_id(conn, "hourly"), scheduled_for=now())
    conn.execute("DELETE FROM job_definitions")
    assert count(conn, "SELECT count(*) FROM job_runs WHERE definition_id IS NULL") == 1


@pytest.mark.parametrize("command", ["show", "pause", "resume", "remove"])
def test_an_unknown_name_is_exit_1(db_url, command):
    result = schedule(db_url, command, "nope")
    assert result.exit_code == 1
    assert result.stderr.strip() == "jobrunner: error: schedule 'nope' not found"


# -- sync -----------------------------------------------------------------------------

FILE = """
[schedules.nightly-report]
cron = "30 2 * * *"
type = "reports.nightly"
timezone = "Europe/Amsterdam"
payload = { format = "pdf" }

[schedules.per-tenant]
cron = "@hourly"
type = "tenants.refresh"
scope = "tenant"
catch_up = "all"
catch_up_limit = 5
max_attempts = 3
priority = 2
"""


def sync(db_url: str, text: str, *args: str):
    return schedule(db_url, "sync", "-", *args, input=text)


def test_sync_adds_the_files_definitions(db_url, conn):
    result = sync(db_url, FILE)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == [
        "add       nightly-report",
        "add       per-tenant",
        "synced: 2 added, 0 changed, 0 unchanged, 0 removed",
    ]
    rows = conn.execute(
        "SELECT name, job_type, payload, schedule, timezone, scope, max_attempts, priority,"
        " catch_up, catch_up_limit, enabled, next_fire_at IS NOT NULL"
        " FROM job_definitions ORDER BY name"
    ).fetchall()
    assert rows == [
        (
            "nightly-report",
            "reports.nightly",
            {"format": "pdf"},
            "30 2 * * *",
            "Europe/Amsterdam",
            "global",
            None,
            0,
            "latest",
            100,
            True,
            True,
        ),
        (
            "per-tenant",
            "tenants.refresh",
            {},
            "@hourly",
            "UTC",
            "tenant",
            3,
            2,
            "all",
            5,
            True,
            True,
        ),
    ]


def test_sync_sets_and_changes_the_overlap_policy(db_url, conn):
    sync(db_url, FILE.replace('scope = "tenant"', 'scope = "tenant"\noverlap = "queue"'))
    rows = conn.execute("SELECT name, overlap FROM job_definitions ORDER BY name").fetchall()
    assert rows == [("nightly-report", "allow"), ("per-tenant", "queue")]
    changed = sync(db_url, FILE.replace('scope = "tenant"', 'scope = "tenant"\noverlap = "skip"'))
    assert "change    per-tenant  (overlap)" in changed.stdout


def test_sync_refuses_an_unknown_overlap_policy(db_url, conn):
    result = sync(db_url, FILE.replace('scope = "tenant"', 'scope = "tenant"\noverlap = "never"'))
    assert result.exit_code == 2
    assert "invalid overlap policy 'never': expected allow, skip or queue" in result.stderr
    assert count(conn, "SELECT count(*) FROM job_definitions") == 0


def test_sync_again_changes_nothing(db_url, conn):
    sync(db_url, FILE)
    before = conn.execute("SELECT * FROM job_definitions ORDER BY id").fetchall()
    result = sync(db_url, FILE)
    assert result.stdout.splitlines()[:2] == ["unchanged nightly-report", "unchanged per-tenant"]
    assert conn.execute("SELECT * FROM job_definitions ORDER BY id").fetchall() == before


def test_sync_plans_changes_and_keeps_or_prunes_what_the_file_lacks(db_url, conn):
    sync(db_url, FILE)
    add(db_url, "by-hand", "--cron", "@daily", "--type", "t")
    changed = FILE.replace('format = "pdf"', 'format = "html"').replace("priority = 2", "")
    changed += '\n[schedules.new-one]\ncron = "@weekly"\ntype = "t"\n'
    dry = sync(db_url, changed, "--dry-run", "--prune")
    assert dry.exit_code == 0, dry.stderr
    assert dry.stdout.splitlines() == [
        "change    nightly-report  (payload)",
        "change    per-tenant  (priority)",
        "add       new-one",
        "remove    by-hand",
        "dry run, nothing written: 1 to add, 2 to change, 0 unchanged, 1 to remove",
    ]
    assert count(conn, "SELECT count(*) FROM job_definitions") == 3
    assert conn.execute(
        "SELECT payload FROM job_definitions WHERE name = 'nightly-report'"
    ).fetchone() == ({"format": "pdf"},)
    kept = sync(db_url, changed)
    assert "keep      by-hand  (not in the file; --prune removes it)" in kept.stdout
    assert count(conn, "SELECT count(*) FROM job_definitions") == 4
    pruned = sync(db_url, changed, "--prune")
    assert "remove    by-hand" in pruned.stdout
    names = [r[0] for r in conn.execute("SELECT name FROM job_definitions ORDER BY name")]
    assert names == ["new-one", "nightly-report", "per-tenant"]


def test_sync_restarts_the_timing_of_a_changed_schedule_only(db_url, conn):
    sync(db_url, FILE)
    conn.execute("UPDATE job_definitions SET materialized_through = now() - interval '1 day'")
    payload_only = FILE.replace('format = "pdf"', 'format = "html"')
    sync(db_url, payload_only)
    row = conn.execute(
        "SELECT materialized_through < now() - interval '1 hour' FROM job_definitions"
        " WHERE name = 'nightly-report'"
    ).fetchone()
    assert row == (True,)
    sync(db_url, payload_only.replace('"30 2 * * *"', '"45 3 * * *"'))
    row = conn.execute(
        "SELECT materialized_through >= now() - interval '1 minute',"
        " to_char(next_fire_at AT TIME ZONE 'Europe/Amsterdam', 'HH24:MI')"
        " FROM job_definitions WHERE name = 'nightly-report'"
    ).fetchone()
    assert row == (True, "03:45")


def test_a_paused_definition_stays_paused_unless_the_file_says_enabled(db_url, conn):
    sync(db_url, FILE)
    schedule(db_url, "pause", "nightly-report")
    assert "unchanged nightly-report" in sync(db_url, FILE).stdout
    enabled = FILE.replace('type = "reports.nightly"', 'type = "reports.nightly"\nenabled = true')
    assert "change    nightly-report  (enabled)" in sync(db_url, enabled).stdout
    disabled = enabled.replace("enabled = true", "enabled = false")
    sync(db_url, disabled)
    assert conn.execute(
        "SELECT enabled FROM job_definitions WHERE name = 'nightly-report'"
    ).fetchone() == (False,)


BAD_FILES = {
    "TOML syntax": ("[schedules.x\ncron = 1", "invalid TOML"),
    "unknown top-level key": ("[schedule.x]\ncron = '@daily'\ntype = 't'", "unknown top-level"),
    "unknown key": ("[schedules.x]\ncron = '@daily'\ntype = 't'\nretries = 3", "'retries'"),
    "missing cron": ("[schedules.x]\ntype = 't'", "missing key 'cron'"),
    "bad cron": ("[schedules.x]\ncron = '0 0 31 2 *'\ntype = 't'", "never fires"),
    "bad timezone": ("[schedules.x]\ncron = '@daily'\ntype = 't'\ntimezone = 'Mars'", "Mars"),
    "datetime payload": (
        "[schedules.x]\ncron = '@daily'\ntype = 't'\npayload = { at = 2026-01-01T00:00:00Z }",
        "not JSON",
    ),
    "bad name": ("[schedules.'a b']\ncron = '@daily'\ntype = 't'", "invalid schedule name"),
    "not a table": ("[schedules]\nx = 1", "expected a table"),
    "enabled not a bool": ("[schedules.x]\ncron = '@daily'\ntype = 't'\nenabled = 1", "enabled"),
}


@pytest.mark.parametrize(("text", "message"), BAD_FILES.values(), ids=BAD_FILES.keys())
def test_an_invalid_file_is_rejected_whole(db_url, conn, text, message):
    result = sync(db_url, FILE + "\n" + text if text.startswith("[schedules.") else text)
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert count(conn, "SELECT count(*) FROM job_definitions") == 0


def test_an_invalid_entry_names_the_file_and_the_schedule(db_url, tmp_path):
    path = tmp_path / "schedules.toml"
    path.write_text(FILE.replace('"@hourly"', '"@every-hour"'))
    result = schedule(db_url, "sync", str(path))
    assert result.exit_code == 2
    assert f"{path}: schedule 'per-tenant': unknown cron alias '@every-hour'" in result.stderr


# -- preview --------------------------------------------------------------------------


def test_preview_prints_fire_times_strictly_after_from_one_per_line():
    result = run_cli(
        "schedule", "preview", "*/15 * * * *", "--from", "2026-05-12T10:15:00Z", "--count", "3"
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == [
        "2026-05-12T10:30:00+00:00",
        "2026-05-12T10:45:00+00:00",
        "2026-05-12T11:00:00+00:00",
    ]


def test_preview_shows_the_repeated_hour_rule_in_local_time():
    result = run_cli(
        "schedule",
        "preview",
        "30 2 * * *",
        "--timezone",
        "Europe/Amsterdam",
        "--from",
        "2026-10-24T12:00",
        "--count",
        "2",
    )
    # A bare croniter gives 02:30+02:00 and 02:30+01:00 on the 25th; once is right.
    assert result.stdout.splitlines() == ["2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"]


def test_preview_reads_a_from_without_offset_in_the_timezone():
    result = run_cli(
        "schedule",
        "preview",
        "0 * * * *",
        "--timezone",
        "America/New_York",
        "--from",
        "2026-03-08T00:30",
        "--count",
        "3",
    )
    assert result.stdout.splitlines() == [
        "2026-03-08T01:00:00-05:00",
        "2026-03-08T03:00:00-04:00",
        "2026-03-08T04:00:00-04:00",
    ]


def test_preview_without_from_starts_now_and_needs_no_database():
    unreachable = {"JOBRUNNER_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"}
    result = run_cli("schedule", "preview", "@daily", "--count", "2", env=unreachable)
    assert result.exit_code == 0, result.stderr
    first, second = (datetime.fromisoformat(line) for line in result.stdout.splitlines())
    assert second - first == timedelta(days=1)
    assert first > datetime.now(first.tzinfo) - timedelta(seconds=5)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["0 0 30 2 *"], "never fires"),
        (["0 0 L * *"], "day-of-month value 'L'"),
        (["0 0 * * 5#3"], "day-of-week value '5#3'"),
        (["H * * * *"], "minute value 'H'"),
        (["0 0 ? * *"], "day-of-month value '?'"),
        (["0 0 12 * * *"], "seconds and years are not supported"),
        (["@daily", "--timezone", "Nowhere/Land"], "unknown timezone"),
        (["@daily", "--from", "yesterday"], "invalid --from"),
        (["@daily", "--count", "0"], "--count"),
    ],
)
def test_preview_bad_input_is_exit_2(args, message):
    result = run_cli("schedule", "preview", *args)
    assert result.exit_code == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


# -- tick ------------------------------------------------------------------------------


def test_tick_with_a_tenant_scoped_schedule_and_no_tenant_query_exits_1_after_its_work(
    db_url, conn
):
    add(db_url, "per-tenant", "--cron", "*/5 * * * *", "--type", "test.ok", "--scope", "tenant")
    add(db_url, "global", "--cron", "*/5 * * * *", "--type", "test.ok")
    make_due(conn)
    result = run_cli("tick", "--database-url", db_url, "--handlers", HANDLERS, "--json")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["succeeded"] == 1  # the global schedule's run
    assert result.stderr.strip().splitlines()[-1] == (
        "jobrunner: error: schedule 'per-tenant' not materialized: it is tenant-scoped and no"
        " tenant query is configured (set --tenants-sql or JOBRUNNER_TENANTS_SQL)"
    )


def test_an_empty_tenant_query_is_bad_input(db_url):
    result = run_cli(
        "tick", "--database-url", db_url, "--handlers", HANDLERS, "--tenants-sql", " ; "
    )
    assert result.exit_code == 2
    assert "empty tenant query" in result.stderr


def test_the_demo_materializes_a_global_and_a_tenant_schedule_then_removes_them(db_url, conn):
    result = run_cli("demo", "--write-to-configured-database", "--database-url", db_url)
    assert result.exit_code == 0, result.stderr
    assert "materialized 4 scheduled runs" in result.stdout
    for tenant in ("acme", "globex", "initech"):
        assert f"UTC for tenant {tenant}, ran once, fine" in result.stdout
    assert count(conn, "SELECT count(*) FROM job_definitions") == 0
    assert count(conn, "SELECT count(*) FROM job_runs WHERE scheduled_for IS NOT NULL") == 4


def test_schedules_written_badly_by_sql_are_still_listed_and_shown(db_url, conn):
    # Rows no command would accept: a zone since removed, a field of thousands of digits.
    conn.execute(
        "INSERT INTO job_definitions (name, job_type, schedule, timezone, materialized_through,"
        " next_fire_at) VALUES ('gone-zone', 'x', '*/5 * * * *', 'Mars/Olympus_Mons', now(),"
        " now() + interval '5 minutes'), ('digits', 'x', '0 ' || repeat('1', 5000) || ' * * *',"
        " 'UTC', now(), now() + interval '5 minutes')"
    )
    listed = schedule(db_url, "list")
    assert listed.exit_code == 0, listed.stderr
    assert "gone-zone" in listed.stdout and "digits" in listed.stdout
    for name in ("gone-zone", "digits"):
        shown = schedule(db_url, "show", name)
        assert shown.exit_code == 0, shown.stderr
        assert "cannot be evaluated" in shown.stdout or "unknown timezone" in shown.stdout
        as_json = json.loads(schedule(db_url, "show", name, "--json").stdout)
        assert as_json["upcoming"] == [] and as_json["problem"]
