"""What an operator sees of a limit holding runs back: `status`, `show`, `metrics` and
`check` say the runs are throttled, never stuck or unclaimed."""

from __future__ import annotations

import json

from tests.conftest import run_cli
from tests.factories import insert_run, insert_runs, now


def limited_backlog(db_url, conn) -> int:
    """flow.work limited to one running at a time, one run running and 20 due for an hour."""
    result = run_cli(
        "limit",
        "flow.work",
        "--concurrency",
        "1",
        "--reason",
        "partner API",
        "--database-url",
        db_url,
    )
    assert result.exit_code == 0, result.stderr
    insert_run(conn, "flow.work", status="running", started_at=now("-1 hour"))
    return insert_runs(conn, 20, "flow.work", run_at=now("-1 hour"))[0]


def test_status_names_a_throttled_type_and_not_as_unclaimed(db_url, conn):
    limited_backlog(db_url, conn)
    shown = json.loads(run_cli("status", "--json", "--database-url", db_url).stdout)
    assert [(t["job_type"], t["due"], t["concurrency"]) for t in shown["throttled_job_types"]] == [
        ("flow.work", 20, 1)
    ]
    assert shown["unclaimed_job_types"] == []
    text = run_cli("status", "--database-url", db_url).stdout
    assert "throttled types" in text and "flow.work: at most 1 running" in text


def test_check_max_queue_age_says_throttled_and_does_not_count_them(db_url, conn):
    limited_backlog(db_url, conn)
    result = run_cli("check", "--max-queue-age", "5m", "--database-url", db_url)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "throttled, not counted: flow.work: at most 1 running" in result.stdout + result.stderr


def test_check_still_breaches_for_a_type_nothing_throttles(db_url, conn):
    limited_backlog(db_url, conn)
    insert_run(conn, "other", run_at=now("-1 hour"))
    result = run_cli("check", "--max-queue-age", "5m", "--database-url", db_url)
    assert result.exit_code == 1


def test_show_says_a_due_run_waits_for_its_limit(db_url, conn):
    run_id = limited_backlog(db_url, conn)
    shown = json.loads(run_cli("show", str(run_id), "--json", "--database-url", db_url).stdout)
    assert shown["throttled"].startswith("waiting for its type's limit (at most 1 running")
    plain = insert_run(conn, "other")
    shown = json.loads(run_cli("show", str(plain), "--json", "--database-url", db_url).stdout)
    assert "throttled" not in shown


def test_metrics_count_the_throttled_runs(db_url, conn):
    limited_backlog(db_url, conn)
    text = run_cli("metrics", "--database-url", db_url).stdout
    assert 'jobrunner_throttled_runs{job_type="flow.work"} 20' in text
