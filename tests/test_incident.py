"""Operating during an incident: acting on sets of runs, pausing job types, the audit trail."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import psycopg
import pytest

import tests.handlers.basic  # noqa: F401 - registers the test handlers
from cronjob import store
from cronjob.api import enqueue
from tests.conftest import count, jobrunner_process, run_cli
from tests.factories import insert_runs, now, tick
from tests.test_lifecycle import claim_as, run_row
from tests.test_ops import cli, cli_json


def add_finished(
    conn: psycopg.Connection[Any],
    number: int,
    *,
    status: str = "dead",
    job_type: str = "send_email",
    error_type: str | None = "SMTPServerDisconnected",
    error: str | None = "Connection unexpectedly closed",
    tenant: str | None = None,
    minutes_ago: float = 0,
) -> list[int]:
    """`number` finished runs, as a tick would have left them `minutes_ago`."""
    then = now(f"-{minutes_ago} minutes")
    return insert_runs(
        conn,
        number,
        job_type,
        status=status,
        attempts=3,
        max_attempts=3,
        tenant_id=tenant,
        error_type=error_type,
        last_error=error,
        started_at=then,
        finished_at=then,
        updated_at=then,
    )


def statuses(conn: psycopg.Connection[Any], ids: list[int]) -> dict[int, str]:
    rows = conn.execute("SELECT id, status FROM job_runs WHERE id = ANY(%s)", [ids])
    return dict(rows.fetchall())


def audit_rows(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    """The audit entries as `jobrunner audit` lists them: each with all of its batches."""
    from dataclasses import asdict

    return [asdict(entry) for entry in store.audit_list(conn)]


# -- acting on sets -----------------------------------------------------------


def test_a_dry_run_counts_what_the_filter_selects_and_changes_nothing(db_url, conn):
    dead = add_finished(conn, 5)
    add_finished(conn, 3, error_type="TimeoutError")
    add_finished(conn, 2, job_type="resize_image")

    report = cli_json(
        db_url,
        "retry",
        "--type",
        "send_email",
        "--error-type",
        "SMTPServerDisconnected",
        "--dry-run",
    )

    assert (report["dry_run"], report["total"], report["by_status"]) == (True, 5, {"dead": 5})
    assert report["sample_ids"] == dead
    assert set(statuses(conn, dead).values()) == {"dead"}
    assert audit_rows(conn) == []


def test_retry_by_filter_changes_exactly_what_its_dry_run_counted(db_url, conn):
    inside = add_finished(conn, 4, minutes_ago=30)
    too_old = add_finished(conn, 2, minutes_ago=120)
    too_new = add_finished(conn, 2, minutes_ago=1)
    other_error = add_finished(conn, 2, error_type="TimeoutError", minutes_ago=30)
    succeeded = add_finished(conn, 2, status="succeeded", error_type=None, minutes_ago=30)
    selection = ("--since", "60m", "--until", "10m", "--type", "send_email")

    dry = cli_json(
        db_url, "retry", *selection, "--error-type", "SMTPServerDisconnected", "--dry-run"
    )
    done = cli_json(db_url, "retry", *selection, "--error-type", "SMTPServerDisconnected")

    assert dry["total"] == done["total"] == 4
    assert done["by_status"] == {"dead": 4}
    after = statuses(conn, inside + too_old + too_new + other_error + succeeded)
    assert {after[i] for i in inside} == {"queued"}
    assert {after[i] for i in too_old + too_new + other_error} == {"dead"}
    assert {after[i] for i in succeeded} == {"succeeded"}
    attempts = count(conn, "SELECT max(attempts) FROM job_runs WHERE id = ANY(%s)", inside)
    assert attempts == 0  # a fresh budget


def test_retry_by_ids_reports_each_id_in_json(db_url, conn):
    [dead] = add_finished(conn, 1)
    [done] = add_finished(conn, 1, status="succeeded")
    result = cli(db_url, "retry", str(dead), str(done), "999", "--json")
    assert result.exit_code == 1
    assert json.loads(result.stdout) == [
        {"id": dead, "previous": "dead", "changed": True},
        {"id": done, "previous": "succeeded", "changed": False},
        {"id": 999, "previous": None, "changed": False},
    ]


@pytest.mark.parametrize("named", ["by id", "by filter"])
def test_a_running_run_retried_keeps_the_attempt_it_superseded_in_its_history(db_url, conn, named):
    run_id = enqueue(conn, "test.ok")
    claim_as(conn, "w:1", lease=600)  # attempt 1, running on w:1
    [dead] = add_finished(conn, 1, job_type="test.ok")  # retried beside it: nothing superseded
    how = [str(run_id), str(dead)] if named == "by id" else ["--type", "test.ok"]

    assert cli(db_url, "retry", *how).exit_code == 0

    [superseded] = store.run_attempts_get(conn, run_id)
    assert (superseded.attempt, superseded.worker, superseded.error_type) == (1, "w:1", "retried")
    assert (
        superseded.message
        == "superseded by an operator's retry while the worker w:1 was running it"
    )
    assert store.run_attempts_get(conn, dead) == []
    shown = cli(db_url, "show", str(run_id)).stdout
    assert "#1" in shown and "retried: superseded by an operator's retry" in shown

    tick(db_url, "test.ok")
    run = run_row(conn, run_id)
    assert (run.status, run.attempts) == ("succeeded", 2)  # the next attempt follows it
    assert [a.attempt for a in store.run_attempts_get(conn, run_id)] == [1]


def test_error_like_matches_a_substring_in_any_case_and_its_wildcards_literally(db_url, conn):
    matching = add_finished(conn, 2, error="SMTP: 421 Too_Many connections")
    add_finished(conn, 2, error="SMTP: 421 TooXMany connections")
    add_finished(conn, 1, error=None)

    report = cli_json(db_url, "retry", "--error-like", "too_many", "--dry-run")

    assert (report["total"], report["sample_ids"]) == (2, matching)


def test_tenant_schedule_and_limit_narrow_a_selection(db_url, conn):
    acme = add_finished(conn, 5, tenant="acme")
    add_finished(conn, 5, tenant="globex")
    assert (
        cli(
            db_url,
            "schedule",
            "add",
            "mail",
            "--cron",
            "@hourly",
            "--type",
            "send_email",
        ).exit_code
        == 0
    )
    definition = store.definition_get(conn, "mail")
    conn.execute(
        "UPDATE job_runs SET definition_id = %s WHERE id = ANY(%s)", [definition.id, acme[:3]]
    )

    assert cli_json(db_url, "retry", "--tenant", "acme", "--dry-run")["total"] == 5
    assert cli_json(db_url, "retry", "--schedule", "mail", "--dry-run")["total"] == 3
    done = cli_json(db_url, "retry", "--tenant", "acme", "--limit", "2")
    assert done["total"] == 2
    assert [i for i, s in sorted(statuses(conn, acme).items()) if s == "queued"] == acme[:2]
    assert cli(db_url, "retry", "--schedule", "nope", "--dry-run").exit_code == 1


def test_cancel_by_filter_skips_finished_runs_and_a_running_run_learns_it_at_its_heartbeat(
    db_url, conn
):
    queued = [enqueue(conn, "report", {}) for _ in range(3)]
    running = enqueue(conn, "report", {})
    conn.execute("UPDATE job_runs SET run_at = now() - interval '1 hour' WHERE id = %s", [running])
    [claimed] = store.runs_claim_many(
        conn, job_types=["report"], leases=[60], max_attempts=[3], limit=1, worker="w:1"
    )
    finished = add_finished(conn, 2, job_type="report", status="succeeded")

    report = cli_json(db_url, "cancel", "--type", "report")

    assert (report["total"], report["by_status"]) == (4, {"queued": 3, "running": 1})
    after = statuses(conn, [*queued, running, *finished])
    assert {after[i] for i in [*queued, running]} == {"cancelled"}
    assert {after[i] for i in finished} == {"succeeded"}
    assert store.runs_heartbeat_many(conn, [claimed], [60]) == {}  # lost: the handler is told


def test_prune_by_filter_deletes_only_the_finished_runs_it_selects(db_url, conn):
    old_dead = add_finished(conn, 3, minutes_ago=3 * 24 * 60)
    old_other = add_finished(conn, 2, job_type="other", minutes_ago=3 * 24 * 60)
    live = enqueue(conn, "send_email", {})

    dry = cli_json(db_url, "prune", "--type", "send_email", "--dry-run")
    done = cli_json(db_url, "prune", "--type", "send_email", "--status", "dead")

    assert dry["total"] == done["total"] == 3
    assert done["pruned"] == {"dead": 3}
    left = {r[0] for r in conn.execute("SELECT id FROM job_runs")}
    assert left == {*old_other, live}
    assert not left & set(old_dead)


def test_a_selection_of_many_runs_needs_yes_when_not_on_a_terminal(db_url, conn):
    dead = add_finished(conn, 150)

    refused = cli(db_url, "retry", "--status", "dead")
    assert refused.exit_code == 2
    assert "holds 150 runs" in refused.stderr and "--yes" in refused.stderr
    assert set(statuses(conn, dead).values()) == {"dead"}
    assert audit_rows(conn) == []

    assert cli(db_url, "retry", "--status", "dead", "--yes").exit_code == 0
    assert set(statuses(conn, dead).values()) == {"queued"}


def test_routine_retention_from_cron_asks_no_question(db_url, conn):
    add_finished(conn, 150, minutes_ago=3 * 24 * 60)
    assert cli(db_url, "prune", "--type", "send_email").exit_code == 2  # a filter: --yes
    result = cli(db_url, "prune", "--older-than", "1d", "--status", "dead")
    assert result.exit_code == 0, result.stderr
    assert count(conn, "SELECT count(*) FROM job_runs") == 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["retry"], "give run ids or filters"),
        (["retry", "1", "--status", "dead"], "not both"),
        (["retry", "--status", "succeeded"], "cannot retry succeeded runs"),
        (["cancel", "--status", "dead"], "cannot cancel dead runs"),
        (["retry", "--status", "bogus"], "unknown status 'bogus'"),
        (["retry", "--type", "x", "--since", "yesterday"], "invalid --since 'yesterday'"),
        (["retry", "--error-like", " "], "invalid --error-like"),
        (["retry", "--type", ","], "invalid --type"),
        (["prune"], "nothing to prune"),
        (["prune", "--status", "running"], "cannot prune running runs"),
    ],
)
def test_a_bad_selection_is_refused_with_one_line_and_writes_nothing(db_url, conn, args, message):
    add_finished(conn, 1)
    result = cli(db_url, *args)
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert audit_rows(conn) == []
    assert count(conn, "SELECT count(*) FROM job_runs WHERE status = 'dead'") == 1


def test_bulk_retry_of_100000_dead_runs_matches_its_dry_run_one_batch_per_transaction(db_url, conn):
    add_finished(conn, 100_000)
    add_finished(conn, 500, error_type="TimeoutError")

    args = ("retry", "--status", "dead", "--error-type", "SMTPServerDisconnected")
    dry = cli_json(db_url, *args, "--dry-run")
    done = cli_json(db_url, *args, "--yes")

    assert dry["total"] == done["total"] == 100_000
    assert done["batches"] == 101  # the last one finds the selection exhausted
    # Each batch committed on its own: the retried rows were written by 100 transactions
    # of at most 1,000 rows each, so none was locked for longer than its batch.
    per_transaction = conn.execute(
        "SELECT count(*) FROM job_runs WHERE status = 'queued' GROUP BY xmin::text"
    ).fetchall()
    assert len(per_transaction) == 100
    assert max(n for (n,) in per_transaction) == 1000
    [entry] = audit_rows(conn)
    assert (entry["command"], entry["changed"]) == ("retry", 100_000)


# -- pausing job types --------------------------------------------------------


def test_a_paused_type_is_never_claimed_by_three_concurrent_ticks_while_others_drain(db_url, conn):
    insert_runs(conn, 600, "test.ok")
    insert_runs(conn, 200, "test.fail")
    assert cli(db_url, "pause", "test.fail", "--reason", "bad deploy").exit_code == 0
    ticks = [
        jobrunner_process(
            "tick",
            "--database-url",
            db_url,
            "--handlers",
            "tests.handlers.basic",
            "--concurrency",
            "4",
            "--batch-size",
            "20",
            "--max-runtime",
            "60s",
        )
        for _ in range(3)
    ]
    for process in ticks:
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr[-2000:]

    by_type = dict(
        conn.execute(
            "SELECT job_type || ':' || status || ':' || attempts, count(*) FROM job_runs GROUP BY 1"
        ).fetchall()
    )
    assert by_type == {"test.ok:succeeded:1": 600, "test.fail:queued:0": 200}


def test_a_resumed_type_is_claimed_again_and_pausing_twice_keeps_the_first_reason(db_url, conn):
    run = enqueue(conn, "test.ok", {})
    assert cli(db_url, "pause", "test.ok", "--reason", "first").exit_code == 0
    again = cli(db_url, "pause", "test.ok", "--reason", "second")
    assert again.stdout == "test.ok was already paused\n"
    assert store.job_type_pauses_list(conn)[0].reason == "first"

    assert tick(db_url, "test.ok").claimed == 0
    assert cli(db_url, "resume", "test.ok").stdout == "resumed test.ok\n"
    assert tick(db_url, "test.ok").claimed == 1
    assert statuses(conn, [run]) == {run: "succeeded"}
    assert cli(db_url, "resume", "test.ok").stdout == "test.ok was not paused\n"


def test_a_tick_whose_only_due_work_is_paused_stays_idle(db_url, conn):
    enqueue(conn, "test.ok", {})
    assert store.tick_work_exists(conn, ["test.ok"])[0]
    cli(db_url, "pause", "test.ok")
    assert not store.tick_work_exists(conn, ["test.ok"])[0]


def test_scheduled_runs_of_a_paused_type_still_materialize_and_wait(db_url, conn):
    from datetime import timedelta

    from tests.test_lifecycle import db_now

    assert (
        cli(
            db_url, "schedule", "add", "every-minute", "--cron", "* * * * *", "--type", "test.ok"
        ).exit_code
        == 0
    )
    cli(db_url, "pause", "test.ok")
    report = tick(db_url, "test.ok", now=db_now(conn) + timedelta(minutes=2))
    assert report.claimed == 0
    assert count(conn, "SELECT count(*) FROM job_runs WHERE status = 'queued'") == 1


def test_status_and_check_show_paused_types_and_do_not_count_their_waiting_runs(db_url, conn):
    enqueue(conn, "test.ok", {})
    conn.execute("UPDATE job_runs SET run_at = now() - interval '2 hours'")
    assert cli(db_url, "check", "--max-queue-age", "10m").exit_code == 1
    assert cli_json(db_url, "status")["unclaimed_job_types"] != []

    cli(db_url, "pause", "test.ok", "--reason", "bad deploy", "--actor", "alice")

    checked = cli(db_url, "check", "--max-queue-age", "10m")
    assert checked.exit_code == 0, checked.stdout
    assert "paused, not counted: test.ok" in checked.stdout
    status = cli_json(db_url, "status")
    assert status["unclaimed_job_types"] == []
    [paused] = status["paused_job_types"]
    assert (paused["job_type"], paused["reason"], paused["paused_by"]) == (
        "test.ok",
        "bad deploy",
        "alice",
    )
    text = cli(db_url, "status").stdout
    assert "test.ok by alice" in text and "bad deploy" in text
    assert 'jobrunner_job_type_paused{job_type="test.ok"} 1' in cli(db_url, "metrics").stdout


def test_check_gives_each_paused_types_reason_who_paused_it_and_when(db_url, conn):
    cli(db_url, "pause", "send_email", "--reason", "SMTP credentials broken", "--actor", "alice")
    cli(db_url, "pause", "resize_image", "--actor", "bob")
    conn.execute("UPDATE job_type_pauses SET paused_at = now() - interval '12 minutes'")

    text = cli(db_url, "check", "--max-queue-age", "10m").stdout
    assert text == (
        "OK max-queue-age=10m: nothing is waiting (paused, not counted: resize_image by bob "
        "12m ago; send_email by alice 12m ago: SMTP credentials broken)\n"
    )
    report = cli(db_url, "check", "--max-dead", "0", "--json")
    paused = json.loads(report.stdout)["paused_job_types"]
    assert [(p["job_type"], p["reason"], p["paused_by"]) for p in paused] == [
        ("resize_image", None, "bob"),
        ("send_email", "SMTP credentials broken", "alice"),
    ]
    assert all(p["paused_at"] for p in paused)


def test_check_shows_a_pause_reason_on_one_line_with_control_characters_escaped(db_url, conn):
    reason = "relay down\nOK max-stuck=0: \x1b[2Jall clear " + "x" * 900
    assert cli(db_url, "pause", "send_email", "--reason", reason).exit_code == 0

    text = cli(db_url, "check", "--max-queue-age", "10m").stdout
    [line] = text.splitlines()
    assert "\x1b" not in line and "relay down OK max-stuck=0: \\x1b[2Jall clear" in line
    assert len(line) < 400
    exact = cli_json(db_url, "check", "--stale-schedules")["paused_job_types"]
    assert [p["reason"] for p in exact] == [reason]


# -- the audit trail ----------------------------------------------------------


def _dead(conn: psycopg.Connection[Any]) -> list[int]:
    return add_finished(conn, 3)


MUTATIONS: dict[str, tuple[list[str], int]] = {
    # command line (after the setup below), rows it changes
    "retry ids": (["retry", "{0}", "{1}"], 2),
    "retry filter": (["retry", "--status", "dead"], 3),
    "cancel": (["cancel", "--type", "fresh"], 1),
    "prune": (["prune", "--status", "dead"], 3),
    "prune audit": (["prune", "--audit-older-than", "0s"], 0),
    "pause": (["pause", "a", "b"], 2),
    "resume": (["resume", "paused", "a"], 1),
    "schedule add": (["schedule", "add", "new", "--cron", "@daily", "--type", "t"], 1),
    "schedule pause": (["schedule", "pause", "nightly"], 1),
    "schedule resume": (["schedule", "resume", "nightly"], 0),  # it was not paused
    "schedule remove": (["schedule", "remove", "nightly"], 1),
    "schedule sync": (["schedule", "sync", "-"], 2),
}
SYNC = (
    '[schedules.nightly]\ncron = "0 4 * * *"\ntype = "t"\n'
    '[schedules.other]\ncron = "@daily"\ntype = "t"\n'
)


@pytest.mark.parametrize("name", MUTATIONS)
def test_each_state_changing_command_writes_one_audit_row_with_its_count(db_url, conn, name):
    dead = _dead(conn)
    enqueue(conn, "fresh", {})
    store.job_types_pause(conn, ["paused"], reason=None, actor="setup")
    assert (
        cli(db_url, "schedule", "add", "nightly", "--cron", "0 3 * * *", "--type", "t").exit_code
        == 0
    )
    conn.execute("DELETE FROM job_audit")
    args, changed = MUTATIONS[name]
    result = run_cli(
        *(a.format(*dead) for a in args),
        "--database-url",
        db_url,
        "--reason",
        "incident 42",
        input=SYNC,
        env={"JOBRUNNER_ACTOR": "ops-bot"},
    )
    assert result.exit_code == 0, result.stderr

    [entry] = audit_rows(conn)
    assert entry["changed"] == changed
    assert (entry["actor"], entry["reason"]) == ("ops-bot", "incident 42")
    assert entry["command"] == (name.split(" ")[0] if not name.startswith("schedule") else name)


def test_an_audit_row_records_the_filter_and_a_sample_of_ids(db_url, conn):
    dead = add_finished(conn, 12)
    cli(
        db_url,
        "retry",
        "--status",
        "dead",
        "--type",
        "send_email",
        "--actor",
        "alice",
        "--reason",
        "SMTP back",
    )
    [entry] = audit_rows(conn)
    assert entry["selection"] == {"status": ["dead"], "type": ["send_email"]}
    assert entry["sample_ids"] == dead[:10]
    assert entry["changed"] == 12

    listed = cli_json(db_url, "audit", "--since", "1h")
    assert [(e["command"], e["actor"], e["changed"], e["reason"]) for e in listed] == [
        ("retry", "alice", 12, "SMTP back")
    ]
    text = cli(db_url, "audit").stdout
    assert "alice" in text and "retry" in text and "SMTP back" in text


def test_a_command_of_many_batches_is_one_entry_with_the_runs_of_all_of_them(db_url, conn):
    dead = add_finished(conn, 5)

    assert cli(db_url, "prune", "--status", "dead", "--batch-size", "2").exit_code == 0

    [entry] = cli_json(db_url, "audit")
    assert (entry["command"], entry["changed"], entry["sample_ids"]) == ("prune", 5, dead)
    # The entry is written once, with the first batch; the later ones are appended to it.
    assert count(conn, "SELECT count(*) FROM job_audit") == 1
    assert count(conn, "SELECT count(*) FROM job_audit_batches") == 2


def test_an_audit_entry_carries_the_databases_time_and_login_beside_the_actor(db_url, conn):
    cli(db_url, "pause", "a", "--actor", "alice")

    [entry] = cli_json(db_url, "audit")
    login, clock = conn.execute("SELECT session_user, now()").fetchone()
    assert (entry["actor"], entry["login"]) == ("alice", login)
    assert abs((datetime.fromisoformat(entry["at"]) - clock).total_seconds()) < 60


def test_a_command_that_fails_leaves_no_audit_row(db_url, conn):
    assert cli(db_url, "schedule", "add", "n", "--cron", "@daily", "--type", "t").exit_code == 0
    conn.execute("DELETE FROM job_audit")
    assert cli(db_url, "schedule", "add", "n", "--cron", "@daily", "--type", "t").exit_code == 1
    assert cli(db_url, "schedule", "remove", "missing").exit_code == 1
    assert audit_rows(conn) == []


def test_the_actor_is_the_option_else_the_environment_else_user_at_host(db_url, conn):
    import getpass
    import socket

    cli(db_url, "pause", "a", "--actor", "alice", env={"JOBRUNNER_ACTOR": "bot"})
    cli(db_url, "pause", "b", env={"JOBRUNNER_ACTOR": "bot"})
    cli(db_url, "pause", "c")
    actors = [e["actor"] for e in audit_rows(conn)]
    assert actors == ["alice", "bot", f"{getpass.getuser()}@{socket.gethostname()}"]


def test_prune_audit_older_than_trims_old_entries_only(db_url, conn):
    cli(db_url, "pause", "a")
    cli(db_url, "pause", "b")
    conn.execute(
        "UPDATE job_audit SET at = now() - interval '40 days' WHERE id = "
        "(SELECT min(id) FROM job_audit)"
    )
    result = cli(db_url, "prune", "--audit-older-than", "30d")
    assert result.stdout == "pruned 1 audit entry\n"
    assert [e["command"] for e in audit_rows(conn)] == ["pause", "prune"]
    assert cli_json(db_url, "audit", "--since", "1d")[-1]["changed"] == 1


def test_pause_and_resume_echo_a_type_with_its_control_characters_escaped(db_url):
    job_type = "evil\x1b]0;owned\x07type"
    said = [
        run_cli(command, job_type, "--database-url", db_url, "--reason", "test")
        for command in ("pause", "pause", "resume", "resume")
    ]
    assert [r.exit_code for r in said] == [0, 0, 0, 0], [r.stderr for r in said]
    assert [r.stdout.strip() for r in said] == [
        "paused evil\\x1b]0;owned\\x07type",
        "evil\\x1b]0;owned\\x07type was already paused",
        "resumed evil\\x1b]0;owned\\x07type",
        "evil\\x1b]0;owned\\x07type was not paused",
    ]
