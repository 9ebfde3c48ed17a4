"""Text anyone can write (job types, tenants, error messages) never drives the operator's
terminal: human-readable output shows control characters escaped; --json stays exact."""

from __future__ import annotations

import json
import re

import pytest

from cronjob import log
from tests.conftest import run_cli
from tests.factories import insert_run, now

EVIL_TYPE = "evil\x1b]0;pwned\x07\x1b[2J"
EVIL_TENANT = "t\r\x1b[31mred"
EVIL_ERROR = "boom\x1b[1A\u202eoops\x85\x00end"
# What a terminal acts on: C0 but newline, DEL, C1, and the bidirectional overrides.
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


@pytest.fixture
def evil(conn):
    conn.execute(
        "INSERT INTO job_definitions (name, job_type, schedule, next_fire_at)"
        " VALUES ('nightly\x1b[8m', %s, '0 3 * * *', now() + interval '1 hour')",
        [EVIL_TYPE],
    )
    dead = insert_run(
        conn,
        EVIL_TYPE,
        tenant_id=EVIL_TENANT,
        status="dead",
        attempts=1,
        max_attempts=1,
        last_error=EVIL_ERROR.replace("\x00", ""),
        error_type="E\x1b[0m",
        run_at=now("-1 hour"),
    )
    insert_run(conn, EVIL_TYPE, tenant_id=EVIL_TENANT, run_at=now("-1 hour"))
    conn.execute(
        "INSERT INTO job_attempts (run_id, attempt, worker, error_type, message, traceback)"
        " VALUES (%s, 1, 'w\x1b[5m', 'E\x1b[0m', %s, %s)",
        [dead, EVIL_ERROR.replace("\x00", ""), "Traceback:\n  line\x1b[2K\nError: boom\x1b[1A\n"],
    )


@pytest.mark.parametrize(
    "args",
    [
        ["list"],
        ["show", "1"],
        ["status"],
        ["check", "--max-queue-age", "1s", "--max-dead", "0"],
        ["schedule", "show", "nightly\x1b[8m"],
        ["schedule", "list"],
    ],
)
def test_human_output_shows_control_characters_escaped(db_url, evil, args):
    result = run_cli(*args, "--database-url", db_url)
    assert result.exit_code in (0, 1), result.stderr
    shown = result.stdout + result.stderr
    assert not CONTROL.findall(shown)
    assert "\\x1b" in shown


def test_show_keeps_a_tracebacks_lines_and_escapes_the_rest(db_url, evil):
    out = run_cli("show", "1", "--database-url", db_url).stdout
    assert "      line\\x1b[2K\n    Error: boom\\x1b[1A" in out
    assert "boom\\x1b[1A\\u202eoops\\x85end" in out


def test_show_indents_every_line_of_a_traceback_so_none_passes_for_a_line_of_its_own(db_url, conn):
    stored = (
        "Traceback (most recent call last):\n"
        '  File "app.py", line 1, in handler\n'
        "ValueError: fine\n"
        "OK max-stuck=0: 0 running run(s) with an expired lease\n"
        "\n"
        "status  succeeded\n"
        "  #2  2026-01-05 09:10:00+0000  ValueError: fine  (worker ?)"
    )
    conn.execute(
        "INSERT INTO job_runs (job_type, status, attempts, max_attempts, last_error, error_type,"
        " finished_at) VALUES ('t', 'dead', 1, 1, 'fine', 'ValueError', now())"
    )
    conn.execute(
        "INSERT INTO job_attempts (run_id, attempt, error_type, message, traceback)"
        " VALUES (1, 1, 'ValueError', 'fine', %s)",
        [stored],
    )

    out = run_cli("show", "1", "--database-url", db_url).stdout
    traceback = out.split("last traceback (attempt 1):\n", 1)[1].rstrip("\n").split("\n")
    assert traceback == ["    " + line if line else "" for line in stored.split("\n")]
    exact = json.loads(run_cli("show", "1", "--json", "--database-url", db_url).stdout)
    assert exact["attempt_history"][0]["traceback"] == stored


@pytest.mark.parametrize("args", [["list", "--json"], ["show", "1", "--json"]])
def test_json_output_stays_exact(db_url, evil, args):
    result = run_cli(*args, "--database-url", db_url)
    found = json.loads(result.stdout)
    run = found[-1] if isinstance(found, list) else found
    assert run["job_type"] == EVIL_TYPE
    assert run["tenant_id"] == EVIL_TENANT


def test_console_log_lines_show_control_characters_escaped(capsys):
    log.configure(json=False)
    try:
        log.get_logger().info("run failed", job_type=EVIL_TYPE, error=EVIL_ERROR)
    finally:
        log.configure()
    err = capsys.readouterr().err
    assert "evil\\x1b]0;pwned\\x07" in err
    assert "\x1b]0;" not in err and "\u202e" not in err


def test_an_error_line_shows_the_value_it_echoes_escaped(db_url):
    result = run_cli("list", "--status", "x\x1b[2J", "--database-url", db_url)
    assert result.exit_code == 2
    assert "x\\x1b[2J" in result.stderr and not CONTROL.findall(result.stderr)
