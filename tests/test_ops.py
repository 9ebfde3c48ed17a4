"""Operating jobrunner from a shell: status, list/show, metrics, check, prune.

Every machine output is parsed and held against what the database itself says,
counted here with independent SQL.
"""

from __future__ import annotations

import json
import os
import stat
from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

import tests.handlers.basic  # noqa: F401 - registers the test handlers
from cronjob import store
from cronjob.api import enqueue
from tests.conftest import count, run_cli
from tests.factories import tick
from tests.test_lifecycle import db_now

STATUSES = ("queued", "running", "succeeded", "failed", "dead", "cancelled", "waiting")


def cli(db_url: str, *args: str, env: dict[str, str] | None = None) -> Any:
    return run_cli(*args, "--database-url", db_url, env=env)


def cli_json(db_url: str, *args: str) -> Any:
    result = cli(db_url, *args, "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture
def mixed(db_url: str, conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """Runs in every state a queue goes through, with their ids."""
    now = db_now(conn)
    ids: dict[str, Any] = {}
    ids["succeeded"] = [enqueue(conn, "test.ok"), enqueue(conn, "test.ok")]
    ids["dead"] = enqueue(conn, "test.give_up")
    ids["failed"] = enqueue(conn, "test.fail")  # backs off into the future: not due
    tick(db_url, "test.ok", "test.give_up", "test.fail")
    ids["cancelled"] = enqueue(conn, "test.ok")
    store.runs_cancel_many(conn, [ids["cancelled"]])
    # A worker that claimed an hour ago with a 30 s lease, then vanished.
    ids["stuck"] = enqueue(conn, "test.sleep", run_at=now - timedelta(hours=1))
    store.runs_claim_many(
        conn,
        job_types=["test.sleep"],
        leases=[30],
        max_attempts=[3],
        limit=1,
        worker="gone:1",
        now=now - timedelta(hours=1),
    )
    ids["due"] = enqueue(conn, "test.ok", run_at=now - timedelta(minutes=3))
    ids["orphan"] = enqueue(conn, "orphan.type", run_at=now - timedelta(minutes=30))
    ids["later"] = enqueue(conn, "test.ok", delay="1h")
    return ids


def sql_counts(conn: psycopg.Connection[Any]) -> dict[tuple[str, str], int]:
    rows = conn.execute("SELECT job_type, status, count(*) FROM job_runs GROUP BY 1, 2")
    return {(job_type, status): n for job_type, status, n in rows}


def sql_oldest_due_age(conn: psycopg.Connection[Any], job_type: str | None = None) -> float:
    return conn.execute(
        "SELECT extract(epoch FROM now() - min(run_at))::float8 FROM job_runs"
        " WHERE status IN ('queued', 'failed') AND run_at <= now()"
        " AND (%(t)s::text IS NULL OR job_type = %(t)s)",
        {"t": job_type},
    ).fetchone()[0]


# -- status -------------------------------------------------------------------


def test_status_json_carries_the_numbers_the_database_holds(db_url, conn, mixed):
    status = cli_json(db_url, "status")

    counts = sql_counts(conn)
    for status_name in STATUSES:
        expected = sum(n for (_, s), n in counts.items() if s == status_name)
        assert status["runs"][status_name] == expected, status_name
    for (job_type, status_name), n in counts.items():
        assert status["job_types"][job_type]["runs"][status_name] == n
    assert status["total"] == count(conn, "SELECT count(*) FROM job_runs")
    assert status["dead"] == 1
    assert status["due"] == count(
        conn,
        "SELECT count(*) FROM job_runs WHERE status IN ('queued','failed') AND run_at <= now()",
    )
    assert status["expired_leases"] == count(
        conn, "SELECT count(*) FROM job_runs WHERE status = 'running' AND locked_until < now()"
    )
    assert status["expired_leases"] == 1
    assert status["job_types"]["test.sleep"]["expired_leases"] == 1
    assert status["oldest_due_job_type"] == "orphan.type"
    assert status["oldest_due_age_seconds"] == pytest.approx(sql_oldest_due_age(conn), abs=2)
    assert status["job_types"]["test.ok"]["oldest_due_age_seconds"] == pytest.approx(
        sql_oldest_due_age(conn, "test.ok"), abs=2
    )
    assert status["job_types"]["test.fail"]["oldest_due_age_seconds"] is None


def test_status_names_job_types_that_no_worker_claims(db_url, conn, mixed):
    now = db_now(conn)
    # Due for as long as the orphan, but a run of this type started a minute ago:
    # a worker is on it, just busy.
    for _ in range(2):
        enqueue(conn, "busy.type", run_at=now - timedelta(minutes=30))
    claimed = store.runs_claim_many(
        conn,
        job_types=["busy.type"],
        leases=[600],
        max_attempts=[1],
        limit=1,
        worker="w:1",
        now=now - timedelta(minutes=1),
    )
    assert len(claimed) == 1

    status = cli_json(db_url, "status")
    assert [t["job_type"] for t in status["unclaimed_job_types"]] == ["orphan.type"]
    [orphan] = status["unclaimed_job_types"]
    assert orphan["due"] == 1 and orphan["last_started_at"] is None
    assert orphan["oldest_due_age_seconds"] == pytest.approx(30 * 60, abs=5)

    # With a longer window, a 30-minute wait is not yet worth reporting.
    assert cli_json(db_url, "status", "--unclaimed-after", "1h")["unclaimed_job_types"] == []


def test_status_lists_the_next_fire_time_of_each_definition(db_url, conn):
    conn.execute(
        "INSERT INTO job_definitions (name, job_type, schedule, timezone, enabled, next_fire_at)"
        " VALUES ('nightly-report', 'report.build', '0 3 * * *', 'Europe/Paris', true,"
        "         now() + interval '5 hours'),"
        "        ('old-cleanup', 'cleanup', '@hourly', 'UTC', false, NULL)"
    )
    nightly_at = conn.execute(
        "SELECT next_fire_at FROM job_definitions WHERE name = 'nightly-report'"
    ).fetchone()[0]

    status = cli_json(db_url, "status")
    assert status["schedules"] == [
        {
            "name": "nightly-report",
            "job_type": "report.build",
            "schedule": "0 3 * * *",
            "timezone": "Europe/Paris",
            "enabled": True,
            "next_fire_at": nightly_at.isoformat(),
            "last_success_at": None,
            "last_failure_at": None,
            "stale": False,
        },
        {
            "name": "old-cleanup",
            "job_type": "cleanup",
            "schedule": "@hourly",
            "timezone": "UTC",
            "enabled": False,
            "next_fire_at": None,
            "last_success_at": None,
            "last_failure_at": None,
            "stale": False,
        },
    ]

    text = cli(db_url, "status").stdout
    [nightly_line] = [line for line in text.splitlines() if line.startswith("nightly-report")]
    local = nightly_at.astimezone(ZoneInfo("Europe/Paris")).strftime("%Y-%m-%d %H:%M%z")
    assert "Europe/Paris" in nightly_line and local in nightly_line
    assert "(in 4h59m)" in nightly_line or "(in 5h)" in nightly_line
    [cleanup_line] = [line for line in text.splitlines() if line.startswith("old-cleanup")]
    assert cleanup_line.rstrip().endswith("paused")


def test_status_without_a_terminal_is_a_plain_table(db_url, conn, mixed):
    result = cli(db_url, "status")
    assert result.exit_code == 0, result.stderr
    assert "\x1b[" not in result.stdout  # no colour codes in a pipe or a cron mail
    lines = result.stdout.splitlines()
    [header] = [line for line in lines if line.startswith("JOB TYPE")]
    assert header.split()[2:8] == ["QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "DEAD", "CANCELLED"]
    [ok_row] = [line.split() for line in lines if line.startswith("test.ok ")]
    counts = sql_counts(conn)
    assert [int(n) for n in ok_row[1:7]] == [
        counts.get(("test.ok", s), 0)
        for s in ("queued", "running", "succeeded", "failed", "dead", "cancelled")
    ]
    assert any(
        line.startswith("stuck runs:") and "1 running with an expired lease" in line
        for line in lines
    )
    assert any(line.startswith("unclaimed types:") and "orphan.type" in line for line in lines)


def test_status_refuses_a_bad_duration(db_url):
    result = cli(db_url, "status", "--unclaimed-after", "soon")
    assert result.exit_code == 2 and "invalid --unclaimed-after 'soon'" in result.stderr


def test_status_of_an_empty_queue(db_url):
    status = cli_json(db_url, "status")
    assert status["total"] == 0 and status["runs"] == dict.fromkeys(STATUSES, 0)
    assert status["oldest_due_age_seconds"] is None and status["job_types"] == {}
    assert "no runs" in cli(db_url, "status").stdout


# -- list and show ------------------------------------------------------------


def test_list_json_filters_by_status_and_type_newest_first(db_url, conn, mixed):
    everything = cli_json(db_url, "list", "--limit", "100")
    assert [r["id"] for r in everything] == [
        r[0] for r in conn.execute("SELECT id FROM job_runs ORDER BY id DESC")
    ]
    queued_ok = cli_json(db_url, "list", "--status", "queued", "--type", "test.ok")
    assert [r["id"] for r in queued_ok] == [mixed["later"], mixed["due"]]
    assert {(r["status"], r["job_type"]) for r in queued_ok} == {("queued", "test.ok")}
    several = cli_json(db_url, "list", "--status", "dead,cancelled")
    assert sorted(r["id"] for r in several) == sorted([mixed["dead"], mixed["cancelled"]])
    assert len(cli_json(db_url, "list", "--limit", "2")) == 2


def test_list_json_rows_carry_the_stored_values(db_url, conn, mixed):
    [row] = cli_json(db_url, "list", "--status", "running")
    stored = store.run_get(conn, mixed["stuck"])
    assert row["id"] == stored.id
    assert row["locked_by"] == "gone:1"
    assert row["attempts"] == stored.attempts == 1
    assert row["locked_until"] == stored.locked_until.isoformat()


def test_show_json_carries_the_attempt_history(db_url, conn):
    run_id = enqueue(conn, "test.fail", {"message": "smtp down"})
    now = db_now(conn)
    for day in range(3):
        tick(db_url, "test.fail", now=now + timedelta(days=day))

    shown = cli_json(db_url, "show", str(run_id))
    assert (shown["id"], shown["status"], shown["attempts"]) == (run_id, "dead", 3)
    assert shown["last_error"] == "smtp down"
    history = conn.execute(
        "SELECT attempt, error_type, message, worker FROM job_attempts WHERE run_id = %s"
        " ORDER BY attempt",
        (run_id,),
    ).fetchall()
    assert [
        (a["attempt"], a["error_type"], a["message"], a["worker"]) for a in shown["attempt_history"]
    ] == [tuple(h) for h in history]
    assert len(history) == 3
    assert "RuntimeError: smtp down" in shown["attempt_history"][-1]["traceback"]


def test_show_explains_a_dead_run_in_plain_text(db_url, conn):
    run_id = enqueue(conn, "test.give_up")
    tick(db_url, "test.give_up")
    text = cli(db_url, "show", str(run_id)).stdout
    assert "dead" in text and "\nattempts:\n" in text
    assert "#1" in text and "Fail: permanently broken" in text


def test_show_of_a_missing_run_exits_1_and_bad_list_input_exits_2(db_url):
    missing = cli(db_url, "show", "424242")
    assert missing.exit_code == 1 and "run 424242 not found" in missing.stderr
    bad = cli(db_url, "list", "--status", "sleeping")
    assert bad.exit_code == 2 and "unknown status 'sleeping'" in bad.stderr


# -- metrics ------------------------------------------------------------------


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(family: Any, name: str | None = None) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for s in family.samples
        if name is None or s.name == name
    }


def test_metrics_parse_and_carry_the_numbers_the_database_holds(db_url, conn, mixed):
    result = cli(db_url, "metrics")
    assert result.exit_code == 0, result.stderr
    parsed = families(result.stdout)

    runs = samples(parsed["jobrunner_runs"])
    job_types = {t for t, _ in sql_counts(conn)}
    for job_type in job_types:
        for status_name in STATUSES:
            key = (("job_type", job_type), ("status", status_name))
            assert runs[key] == sql_counts(conn).get((job_type, status_name), 0), key
    assert parsed["jobrunner_runs"].type == "gauge"

    dead = samples(parsed["jobrunner_dead_runs"])
    assert dead[(("job_type", "test.give_up"),)] == 1
    assert sum(dead.values()) == count(conn, "SELECT count(*) FROM job_runs WHERE status='dead'")
    expired = samples(parsed["jobrunner_expired_leases"])
    assert expired[(("job_type", "test.sleep"),)] == 1 and sum(expired.values()) == 1
    due = samples(parsed["jobrunner_due_runs"])
    assert due[(("job_type", "test.ok"),)] == 1 and due[(("job_type", "orphan.type"),)] == 1
    ages = samples(parsed["jobrunner_oldest_due_age_seconds"])
    assert ages[(("job_type", "orphan.type"),)] == pytest.approx(
        sql_oldest_due_age(conn, "orphan.type"), abs=2
    )
    assert ages[(("job_type", "test.fail"),)] == 0  # its retry is not due yet

    started = samples(parsed["jobrunner_last_started_timestamp_seconds"])
    last_ok = conn.execute(
        "SELECT extract(epoch FROM max(started_at))::float8 FROM job_runs WHERE job_type='test.ok'"
    ).fetchone()[0]
    assert started[(("job_type", "test.ok"),)] == pytest.approx(last_ok, abs=0.001)
    assert (("job_type", "orphan.type"),) not in started


def test_metrics_summarize_the_run_time_of_recent_runs(db_url, conn, mixed):
    parsed = families(cli(db_url, "metrics").stdout)
    duration = parsed["jobrunner_run_duration_seconds"]
    assert duration.type == "summary"
    counts = samples(duration, "jobrunner_run_duration_seconds_count")
    sums = samples(duration, "jobrunner_run_duration_seconds_sum")
    rows = conn.execute(
        "SELECT job_type, count(*), sum(extract(epoch FROM finished_at - started_at))::float8"
        " FROM job_runs WHERE status IN ('succeeded', 'dead') GROUP BY job_type"
    ).fetchall()
    assert {key[0][1]: n for key, n in counts.items()} == {t: n for t, n, _ in rows}
    for job_type, _, total in rows:
        assert sums[(("job_type", job_type),)] == pytest.approx(total, abs=1e-6)
    quantiles = samples(duration, "jobrunner_run_duration_seconds")
    assert {dict(k)["quantile"] for k in quantiles} == {"0.5", "0.9", "0.99"}


def test_metrics_leave_runs_finished_over_an_hour_ago_out_of_the_duration_summary(db_url, conn):
    old = enqueue(conn, "test.ok")
    tick(db_url, "test.ok")
    conn.execute(
        "UPDATE job_runs SET started_at = started_at - interval '2 hours',"
        " finished_at = finished_at - interval '2 hours' WHERE id = %s",
        (old,),
    )
    enqueue(conn, "test.ok")
    tick(db_url, "test.ok")
    parsed = families(cli(db_url, "metrics").stdout)
    counts = samples(
        parsed["jobrunner_run_duration_seconds"], "jobrunner_run_duration_seconds_count"
    )
    assert counts == {(("job_type", "test.ok"),): 1}


def test_metrics_escape_awkward_job_type_names(db_url, conn):
    awkward = 'say "hi"\\now\nplease'
    enqueue(conn, awkward)
    parsed = families(cli(db_url, "metrics").stdout)
    runs = samples(parsed["jobrunner_runs"])
    assert runs[(("job_type", awkward), ("status", "queued"))] == 1


def test_metrics_of_an_empty_database_still_parse(db_url):
    parsed = families(cli(db_url, "metrics").stdout)
    assert "jobrunner_runs" in parsed and parsed["jobrunner_runs"].samples == []


def test_metrics_textfile_is_replaced_atomically(db_url, conn, tmp_path):
    path = tmp_path / "jobrunner.prom"
    path.write_text("stale\n")
    before = path.stat().st_ino
    enqueue(conn, "test.ok")

    result = cli(db_url, "metrics", "--textfile", str(path))

    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    assert path.stat().st_ino != before  # a new file renamed over the old one, not rewritten
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert os.listdir(tmp_path) == ["jobrunner.prom"]  # no temporary file left behind
    runs = samples(families(path.read_text())["jobrunner_runs"])
    assert runs[(("job_type", "test.ok"), ("status", "queued"))] == 1


def test_a_metrics_textfile_in_a_missing_directory_is_refused(db_url, tmp_path):
    result = cli(db_url, "metrics", "--textfile", str(tmp_path / "nope" / "jobrunner.prom"))
    assert result.exit_code == 2
    assert "does not exist" in result.stderr and not (tmp_path / "nope").exists()


def test_tick_writes_the_metrics_textfile_after_its_work(db_url, conn, tmp_path):
    path = tmp_path / "jobrunner.prom"
    enqueue(conn, "test.ok")
    result = run_cli(
        "tick",
        "--database-url",
        db_url,
        "--handlers",
        "tests.handlers.basic",
        "--types",
        "test.ok",
        "--metrics-textfile",
        str(path),
    )
    assert result.exit_code == 0, result.stderr
    runs = samples(families(path.read_text())["jobrunner_runs"])
    assert runs[(("job_type", "test.ok"), ("status", "succeeded"))] == 1
    assert runs[(("job_type", "test.ok"), ("status", "queued"))] == 0


# -- check --------------------------------------------------------------------


def test_check_passes_when_no_threshold_is_breached(db_url, conn):
    enqueue(conn, "test.ok")
    result = cli(db_url, "check", "--max-queue-age", "10m", "--max-stuck", "0", "--max-dead", "0")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert [line.split()[:2] for line in result.stdout.splitlines()] == [
        ["OK", "max-queue-age=10m:"],
        ["OK", "max-stuck=0:"],
        ["OK", "max-dead=0:"],
    ]
    quiet = cli(db_url, "check", "--max-dead", "0", "--quiet")
    assert (quiet.exit_code, quiet.stdout) == (0, "")


def test_check_breaches_max_queue_age_with_the_age_it_found(db_url, conn):
    enqueue(conn, "test.ok", run_at=db_now(conn) - timedelta(minutes=15))
    result = cli(db_url, "check", "--max-queue-age", "10m", "--max-dead", "0")
    assert result.exit_code == 1
    assert result.stdout.splitlines()[0].startswith(
        "BREACHED max-queue-age=10m: the oldest due run (test.ok) has waited 15m"
    )
    assert result.stdout.splitlines()[1].startswith("OK max-dead=0")
    assert cli(db_url, "check", "--max-queue-age", "20m").exit_code == 0


def test_check_breaches_max_stuck_when_leases_expired(db_url, conn):
    five_minutes_ago = db_now(conn) - timedelta(minutes=5)
    enqueue(conn, "test.sleep", run_at=five_minutes_ago)
    store.runs_claim_many(
        conn,
        job_types=["test.sleep"],
        leases=[30],
        max_attempts=[3],
        limit=1,
        worker="gone:1",
        now=five_minutes_ago,
    )
    result = cli(db_url, "check", "--max-stuck", "0")
    assert result.exit_code == 1
    assert result.stdout == (
        "BREACHED max-stuck=0: 1 running run(s) with an expired lease (test.sleep 1)\n"
    )
    assert cli(db_url, "check", "--max-stuck", "1").exit_code == 0


def test_check_breaches_max_dead_naming_the_count_per_type(db_url, conn):
    for _ in range(3):
        enqueue(conn, "test.give_up")
    tick(db_url, "test.give_up")
    result = cli(db_url, "check", "--max-dead", "2")
    assert result.exit_code == 1
    assert result.stdout == "BREACHED max-dead=2: 3 dead run(s) (test.give_up 3)\n"
    assert cli(db_url, "check", "--max-dead", "3").exit_code == 0  # at the limit is fine


def test_check_names_every_breached_threshold(db_url, conn, mixed):
    result = cli(db_url, "check", "--max-queue-age", "1m", "--max-stuck", "0", "--max-dead", "0")
    assert result.exit_code == 1
    assert [line.split()[:2] for line in result.stdout.splitlines()] == [
        ["BREACHED", "max-queue-age=1m:"],
        ["BREACHED", "max-stuck=0:"],
        ["BREACHED", "max-dead=0:"],
    ]
    report = json.loads(
        cli(db_url, "check", "--max-dead", "0", "--max-stuck", "5", "--json").stdout
    )
    assert report["ok"] is False
    found = [(f["threshold"], f["value"], f["limit"], f["breached"]) for f in report["findings"]]
    assert found == [("max-stuck", 1, 5, False), ("max-dead", 1, 0, True)]


def test_check_needs_a_threshold_and_valid_values(db_url):
    assert cli(db_url, "check").exit_code == 2
    assert cli(db_url, "check", "--max-queue-age", "soon").exit_code == 2
    assert cli(db_url, "check", "--max-dead", "-1").exit_code == 2


# -- prune --------------------------------------------------------------------


def age_finished(conn: psycopg.Connection[Any], run_ids: list[int], days: int) -> None:
    conn.execute(
        "UPDATE job_runs SET finished_at = now() - make_interval(days => %s) WHERE id = ANY(%s)",
        (days, run_ids),
    )


@pytest.fixture
def aged(db_url: str, conn: psycopg.Connection[Any], mixed: dict[str, Any]) -> dict[str, Any]:
    """`mixed` with its finished runs finished 40 days ago, a run that finished just
    now, and a run running right now; the unfinished runs are made 40 days old too,
    so only their status protects them."""
    recent = enqueue(conn, "test.give_up")
    tick(db_url, "test.give_up")  # also rescues mixed's stuck run, due again and claimed below
    live = enqueue(conn, "test.sleep")
    store.runs_claim_many(
        conn, job_types=["test.sleep"], leases=[3600], max_attempts=[3], limit=2, worker="w:1"
    )
    old = [*mixed["succeeded"], mixed["dead"], mixed["cancelled"]]
    age_finished(conn, old, 40)
    conn.execute(
        "UPDATE job_runs SET run_at = now() - interval '40 days', "
        "created_at = now() - interval '40 days' WHERE finished_at IS NULL"
    )
    assert store.run_get(conn, live).status == "running"
    return {**mixed, "old": old, "recent": recent, "live": live}


def remaining(conn: psycopg.Connection[Any]) -> set[int]:
    return {r[0] for r in conn.execute("SELECT id FROM job_runs")}


def test_prune_deletes_exactly_the_old_finished_runs(db_url, conn, aged):
    before = remaining(conn)
    attempts_of_dead = count(
        conn, "SELECT count(*) FROM job_attempts WHERE run_id = %s", aged["dead"]
    )
    assert attempts_of_dead == 1

    report = cli_json(db_url, "prune", "--older-than", "30d")

    assert remaining(conn) == before - set(aged["old"])
    assert report["pruned"] == {"succeeded": 2, "dead": 1, "cancelled": 1}
    assert (report["total"], report["dry_run"]) == (4, False)
    assert count(conn, "SELECT count(*) FROM job_attempts WHERE run_id = %s", aged["dead"]) == 0
    statuses = {r[0] for r in conn.execute("SELECT status FROM job_runs")}
    assert {"queued", "running", "failed"} <= statuses


def test_prune_takes_the_ledger_keys_of_pruned_runs_with_them(db_url, conn, aged):
    pruned_run, kept_run = aged["old"][0], aged["live"]
    conn.execute(
        "INSERT INTO job_effects (key, run_id, created_at) VALUES"
        " ('old-of-pruned', %s, now() - interval '40 days'),"
        " ('new-of-pruned', %s, now() - interval '1 hour'),"
        " ('old-of-live', %s, now() - interval '40 days')",
        [pruned_run, pruned_run, kept_run],
    )
    report = cli_json(db_url, "prune", "--older-than", "30d", "--keep-effects", "1d")
    keys = {r[0] for r in conn.execute("SELECT key FROM job_effects")}
    assert keys == {"new-of-pruned", "old-of-live"}
    assert report["effects"] == 1

    cli_json(db_url, "prune", "--older-than", "30d")
    assert {r[0] for r in conn.execute("SELECT key FROM job_effects")} == {"old-of-live"}


def test_prune_by_status_and_dry_run(db_url, conn, aged):
    before = remaining(conn)
    dry = cli_json(db_url, "prune", "--older-than", "30d", "--dry-run")
    assert dry["pruned"] == {"succeeded": 2, "dead": 1, "cancelled": 1} and dry["dry_run"]
    assert remaining(conn) == before

    text = cli(db_url, "prune", "--older-than", "30d", "--status", "dead")
    assert text.exit_code == 0
    assert text.stdout == "pruned 1 run(s) finished more than 30d ago (dead 1)\n"
    assert remaining(conn) == before - {aged["dead"]}


def test_prune_works_in_batches(db_url, conn):
    ids = [enqueue(conn, "test.ok") for _ in range(5)]
    tick(db_url, "test.ok")
    age_finished(conn, ids, 2)
    report = cli_json(db_url, "prune", "--older-than", "1d", "--batch-size", "2")
    assert (report["total"], report["batches"]) == (5, 3)
    assert remaining(conn) == set()


def test_prune_stops_after_the_batches_it_was_given(db_url, conn):
    from cronjob.prune import prune_runs

    ids = [enqueue(conn, "test.ok") for _ in range(5)]
    tick(db_url, "test.ok")
    age_finished(conn, ids, 2)
    report = prune_runs(conn, older_than=86400, batch_size=2, max_batches=1)
    assert (report.total, report.batches) == (2, 1)
    assert len(remaining(conn)) == 3


def test_prune_refuses_unfinished_statuses(db_url, conn, aged):
    before = remaining(conn)
    for status_name in ("queued", "running", "failed"):
        result = cli(db_url, "prune", "--older-than", "1s", "--status", f"dead,{status_name}")
        assert result.exit_code == 2
        assert f"cannot prune {status_name} runs" in result.stderr
    assert cli(db_url, "prune", "--older-than", "1s", "--status", "done").exit_code == 2
    assert cli(db_url, "prune").exit_code == 2  # --older-than is required
    assert remaining(conn) == before


def test_prune_never_deletes_unfinished_runs_whatever_it_is_asked(conn, aged):
    from cronjob.queries.runs import RUNS_PRUNE_BATCH

    before = remaining(conn)
    conn.execute(
        RUNS_PRUNE_BATCH,
        {"statuses": list(STATUSES), "older_than": 0, "limit": 1000, "now": None},
    )
    assert remaining(conn) == before - set(aged["old"]) - {aged["recent"]}


def test_tick_prunes_old_finished_runs_when_asked(db_url, conn, aged):
    before = remaining(conn)
    result = run_cli(
        "tick",
        "--database-url",
        db_url,
        "--handlers",
        "tests.handlers.basic",
        "--types",
        "test.fail",
        "--prune-older-than",
        "30d",
        "--json",
    )
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["pruned"] == 4
    assert remaining(conn) == before - set(aged["old"])


def test_tick_does_not_prune_unless_asked(db_url, conn, aged):
    before = remaining(conn)
    result = run_cli(
        "tick",
        "--database-url",
        db_url,
        "--handlers",
        "tests.handlers.basic",
        "--types",
        "test.fail",
        "--json",
    )
    assert result.exit_code == 0, result.stderr
    assert "pruned" not in json.loads(result.stdout)
    assert remaining(conn) == before


# -- connections --------------------------------------------------------------


def test_the_runner_timeouts_are_set_and_options_in_the_url_are_kept(database_url):
    from psycopg import conninfo

    from cronjob.db import connect

    params = conninfo.conninfo_to_dict(database_url)
    params["options"] = "-c search_path=elsewhere,public -c lock_timeout=1234"
    with connect(conninfo.make_conninfo(**params)) as conn:
        assert conn.execute("SHOW search_path").fetchone()[0] == "elsewhere,public"
        assert conn.execute("SHOW statement_timeout").fetchone()[0] == "30s"
        assert conn.execute("SHOW lock_timeout").fetchone()[0] == "1234ms"  # theirs wins


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o027, 0o640)])
def test_metrics_textfile_mode_follows_the_umask(db_url, tmp_path, umask, mode):
    path = tmp_path / "jobrunner.prom"
    previous = os.umask(umask)
    try:
        result = cli(db_url, "metrics", "--textfile", str(path))
    finally:
        os.umask(previous)
    assert result.exit_code == 0, result.stderr
    assert stat.S_IMODE(path.stat().st_mode) == mode
