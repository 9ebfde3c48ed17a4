"""What a handler logs while it runs is kept with its attempt, and `show` prints it."""

from __future__ import annotations

import json

from tests.conftest import count, jobrunner_process, run_cli
from tests.factories import insert_run

HANDLERS = "tests.handlers.observed"


def tick(db_url: str) -> str:
    """One `jobrunner tick` process; returns its stderr."""
    process = jobrunner_process("tick", "--database-url", db_url, "--handlers", HANDLERS)
    _out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    return err


def retry_now(db_url: str, run_id: int) -> None:
    assert run_cli("retry", str(run_id), "--database-url", db_url).exit_code == 0


def test_show_prints_what_each_attempt_logged_under_it_with_passwords_redacted(db_url, conn):
    run_id = insert_run(conn, "test.chatty", payload={"amount": 12})
    tick(db_url)  # the first attempt logs three events and fails
    retry_now(db_url, run_id)
    tick(db_url)  # the second logs them again and succeeds

    shown = run_cli("show", str(run_id), "--database-url", db_url)

    assert shown.exit_code == 0, shown.stderr
    text = shown.stdout.split("\nattempts:\n", 1)[1].split("\nlast traceback", 1)[0]
    lines = text.splitlines()
    first, second = lines[0], lines[4]
    assert first.startswith("  #1  ") and "RuntimeError: card declined" in first
    assert second.startswith("  #2  ") and "succeeded" in second
    for events in (lines[1:4], lines[5:8]):
        assert [line.split()[1:3] for line in events] == [
            ["info", "charging"],
            ["warning", "connecting"],
            ["warning", "slow"],
        ]
        assert all(line.startswith("    ") for line in events)
        assert "amount=12" in events[0]
        assert "url=postgresql://shop:***@db.internal/shop" in events[1]
        assert "slow answer from the bank  logger=shop.payments" in events[2]
    assert len(lines) == 8
    assert "hunter2" not in shown.stdout


def test_show_json_carries_each_attempts_events_as_a_list(db_url, conn):
    run_id = insert_run(conn, "test.chatty")
    tick(db_url)
    retry_now(db_url, run_id)
    tick(db_url)

    shown = json.loads(run_cli("show", str(run_id), "--database-url", db_url, "--json").stdout)

    logs = shown["attempt_logs"]
    assert [(log["attempt"], log["outcome"], log["trimmed"]) for log in logs] == [
        (1, "failed", 0),
        (2, "succeeded", 0),
    ]
    for log in logs:
        assert [event["event"] for event in log["events"]] == [
            "charging card",
            "connecting",
            "slow answer from the bank",
        ]
        assert all(event["timestamp"].endswith("Z") for event in log["events"])
        assert log["events"][0] == {**log["events"][0], "level": "info", "amount": 10}
    assert "hunter2" not in json.dumps(shown)


def test_each_kept_event_is_the_line_the_tick_wrote_for_it_on_stderr(db_url, conn):
    run_id = insert_run(conn, "test.chatty", attempts=1, max_attempts=3)
    err = tick(db_url)
    query = "SELECT events FROM job_run_logs WHERE run_id = %s"
    [events] = conn.execute(query, [run_id]).fetchone()
    # The logging record goes where the app's logging sends it: with no handler of the app's,
    # a JSON line of jobrunner's, with the run's fields as ctx.log's; the kept event is timed
    # when the record was made.
    written = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    lines = [line for line in written if line.get("run_id") == run_id][:3]
    assert events[:2] == lines[:2]
    assert events[2] == {**lines[2], "timestamp": events[2]["timestamp"]}
    assert events[2]["logger"] == "shop.payments"


def test_a_type_that_switches_capture_off_keeps_nothing(db_url, conn):
    insert_run(conn, "test.quiet_chatty")
    err = tick(db_url)
    assert '"not kept"' in err  # still on stderr, as always
    assert count(conn, "SELECT count(*) FROM job_run_logs") == 0


def test_a_handler_that_logs_nothing_writes_no_run_log(db_url, conn):
    insert_run(conn, "test.log_flood", payload={"events": 0})
    tick(db_url)
    assert count(conn, "SELECT count(*) FROM job_runs WHERE status = 'succeeded'") == 1
    assert count(conn, "SELECT count(*) FROM job_run_logs") == 0


def test_an_attempt_keeps_its_newest_hundred_events_and_counts_the_rest(db_url, conn):
    run_id = insert_run(conn, "test.log_flood", payload={"events": 250})
    tick(db_url)
    shown = json.loads(run_cli("show", str(run_id), "--database-url", db_url, "--json").stdout)
    [log] = shown["attempt_logs"]
    assert [event["n"] for event in log["events"]] == list(range(150, 250))
    assert log["trimmed"] == 150
    text = run_cli("show", str(run_id), "--database-url", db_url).stdout
    assert "    (150 earlier events not kept)" in text


def test_a_handler_given_up_at_its_timeout_keeps_what_it_logged_until_then(db_url, conn):
    run_id = insert_run(conn, "test.logs_then_hangs")
    tick(db_url)
    shown = json.loads(run_cli("show", str(run_id), "--database-url", db_url, "--json").stdout)
    [log] = shown["attempt_logs"]
    assert (log["outcome"], [e["event"] for e in log["events"]]) == ("dead", ["about to hang"])


def test_prune_removes_a_runs_logs_with_it(db_url, conn):
    insert_run(conn, "test.log_flood", payload={"events": 3})
    tick(db_url)
    conn.execute("UPDATE job_runs SET finished_at = now() - interval '2 days'")
    assert count(conn, "SELECT count(*) FROM job_run_logs") == 1

    pruned = run_cli("prune", "--older-than", "1d", "--yes", "--database-url", db_url)

    assert pruned.exit_code == 0, pruned.stderr
    assert count(conn, "SELECT count(*) FROM job_runs") == 0
    assert count(conn, "SELECT count(*) FROM job_run_logs") == 0


def test_the_caps_count_utf8_bytes_not_characters(db_url, conn):
    from cronjob.runlog import MAX_BYTES, MAX_EVENT_BYTES, MAX_EVENTS

    # 100 events of 900 bytes (300 characters): 90 KB, of which at most 32 KB are kept.
    many = insert_run(conn, "test.log_wide", payload={"events": 100, "width": 300})
    # One event of 6,000 bytes (2,000 characters): over the 4 KB an event may take.
    wide = insert_run(conn, "test.log_wide", payload={"events": 1, "width": 2000})
    tick(db_url)

    query = "SELECT octet_length(events::text), trimmed, events FROM job_run_logs WHERE run_id = %s"
    size, trimmed, events = conn.execute(query, [many]).fetchone()
    # jsonb's text writes ", " between events where the cap counts one byte.
    assert MAX_BYTES // 2 < size <= MAX_BYTES + MAX_EVENTS
    assert trimmed == 100 - len(events) > 50
    assert [e["n"] for e in events] == list(range(trimmed, 100))
    size, trimmed, [event] = conn.execute(query, [wide]).fetchone()
    assert size <= MAX_EVENT_BYTES and trimmed == 0
    assert event["clipped_bytes"] > 6000 and event["event"].startswith("日本語")
    assert len(event["event"].encode()) <= 1000
