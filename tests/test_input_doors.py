"""Every door refuses what would break jobrunner later: one line, exit 2, nothing written.

Times beyond the calendar, keys too long for their index, ids that only Python reads as
numbers, text that is not UTF-8, numbers of thousands of digits, inputs of any size, and
long bad values echoed back. Readers survive a bad row that got in by other means.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from psycopg import sql

from bench.suite.procs import PEAK_OF
from tests.conftest import ROOT, count, run_cli
from tests.factories import insert_run

FAR_PAST = "0001-01-01T00:00:00+01:00"
FAR_FUTURE = "9999-12-31T23:00:00-05:00"
RANGE = "from 1900-01-01 to 9000-01-01 UTC"


def _one_line_exit_2(result, message: str) -> str:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert message in lines[0], lines[0]
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    return lines[0]


# -- 1: times beyond the calendar ---------------------------------------------------------


@pytest.mark.parametrize("moment", [FAR_PAST, FAR_FUTURE, "1899-12-31T23:59:59Z"])
def test_a_run_at_beyond_the_calendar_is_refused_by_enqueue_run_at(db_url, conn, moment):
    result = run_cli("enqueue", "t", "--run-at", moment, "--database-url", db_url)
    _one_line_exit_2(result, RANGE)
    assert count(conn, "SELECT count(*) FROM job_runs") == 0


@pytest.mark.parametrize("moment", [FAR_PAST, FAR_FUTURE])
def test_a_run_at_beyond_the_calendar_is_refused_by_enqueue_jsonl(db_url, conn, moment):
    lines = json.dumps({"type": "t"}) + "\n" + json.dumps({"type": "t", "run_at": moment}) + "\n"
    result = run_cli("enqueue", "--jsonl", "-", "--database-url", db_url, input=lines)
    assert "line 2" in _one_line_exit_2(result, RANGE)
    assert count(conn, "SELECT count(*) FROM job_runs") == 0


@pytest.mark.parametrize(
    "moment",
    [
        datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1))),
        datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5))),
        datetime(9999, 12, 31, tzinfo=UTC),
    ],
)
def test_a_run_at_beyond_the_calendar_is_refused_by_the_python_api(conn, moment):
    from cronjob.api import enqueue
    from cronjob.errors import BadInput

    with pytest.raises(BadInput, match=RANGE):
        enqueue(conn, "t", run_at=moment)
    assert count(conn, "SELECT count(*) FROM job_runs") == 0


def test_the_ends_of_the_accepted_range_are_accepted(conn):
    from cronjob.api import enqueue

    enqueue(conn, "t", run_at=datetime(1900, 1, 1, tzinfo=UTC))
    enqueue(conn, "t", run_at=datetime(9000, 1, 1, tzinfo=UTC))
    assert count(conn, "SELECT count(*) FROM job_runs") == 2


@pytest.mark.parametrize(
    "args",
    [
        ["list"],
        ["list", "--json"],
        ["status"],
        ["status", "--json"],
        ["metrics"],
        ["check", "--max-stuck", "0"],
        ["show", "1"],
        ["show", "2"],
        ["show", "3"],
    ],
)
def test_readers_survive_times_beyond_the_calendar_already_stored(db_url, conn, args):
    # Written as an app could, in SQL, past jobrunner's checks.
    for moment in (FAR_PAST, FAR_FUTURE, "infinity"):
        insert_run(conn, "t", run_at=sql.SQL("{}::timestamptz").format(moment))
    result = run_cli(*args, "--database-url", db_url)
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""


# -- 2: idempotency keys --------------------------------------------------------------------


def test_an_idempotency_key_longer_than_1000_bytes_is_refused_before_the_database(db_url, conn):
    key = "鍵" * 400  # 400 characters, 1200 bytes: short in characters, long for the index
    result = run_cli("enqueue", "t", "--idempotency-key", key, "--database-url", db_url)
    _one_line_exit_2(result, "longer than 1000 bytes")
    line = json.dumps({"type": "t", "idempotency_key": "鍵" * 999}) + "\n"
    result = run_cli("enqueue", "--jsonl", "-", "--database-url", db_url, input=line)
    _one_line_exit_2(result, "longer than 1000 bytes")
    assert count(conn, "SELECT count(*) FROM job_runs") == 0


def test_the_python_api_refuses_an_idempotency_key_over_1000_bytes_and_takes_1000(conn):
    from cronjob.api import enqueue
    from cronjob.errors import BadInput

    with pytest.raises(BadInput, match="1000 bytes"):
        enqueue(conn, "t", idempotency_key="é" * 501)
    first = enqueue(conn, "t", idempotency_key="é" * 500)
    assert enqueue(conn, "t", idempotency_key="é" * 500) == first


@pytest.mark.parametrize("door", ["@handler", "enqueue", "schedule"])
def test_every_door_takes_1000_attempts_and_refuses_1001(door, fresh_registry):
    from cronjob.api import new_run
    from cronjob.definitions import definition_spec
    from cronjob.errors import BadInput
    from cronjob.handlers import handler

    def ask(attempts: int) -> object:
        if door == "@handler":
            return handler("t", max_attempts=attempts)(lambda ctx, payload: None)
        if door == "enqueue":
            return new_run("t", max_attempts=attempts)
        return definition_spec("s", cron="* * * * *", job_type="t", max_attempts=attempts)

    ask(1000)
    with pytest.raises(BadInput, match="1001: expected an integer from 1 to 1000"):
        ask(1001)


def test_handler_names_a_backoff_that_is_no_pair(fresh_registry):
    from cronjob.errors import BadInput
    from cronjob.handlers import handler

    with pytest.raises(
        BadInput, match=r"^handler 't': invalid backoff: a \(base, cap\) pair, not 3"
    ):
        handler("t", backoff=("1s", "2s", "3s"))


# -- 3: ids and counts in ASCII digits --------------------------------------------------------


def test_cancel_1_0_names_no_run_and_leaves_run_10_alone(db_url, conn):
    from cronjob.api import enqueue

    for _ in range(10):
        enqueue(conn, "t")
    result = run_cli("cancel", "1_0", "--database-url", db_url)
    _one_line_exit_2(result, "invalid run id")
    assert count(conn, "SELECT count(*) FROM job_runs WHERE status = 'cancelled'") == 0


@pytest.mark.parametrize(
    "args",
    [
        ["cancel", "\u0661\u0660"],  # Arabic-Indic 10
        ["retry", "1_0"],
        ["show", "\uff11\uff10"],  # fullwidth 10
        ["list", "--limit", "1_0"],
        ["list", "--limit", "\u0663"],
        ["enqueue", "t", "--max-attempts", "1_0"],
        ["enqueue", "t", "--priority", "\u0663"],
        ["check", "--max-dead", "1_0"],
        ["prune", "--older-than", "1d", "--batch-size", "1_000"],
        ["schedule", "preview", "* * * * *", "--count", "1_0"],
        ["tick", "--concurrency", "\u00b2"],
    ],
)
def test_ids_counts_limits_and_sizes_are_ascii_digits_only(db_url, conn, args):
    result = run_cli(*args, "--database-url", db_url) if args[0] != "schedule" else run_cli(*args)
    assert result.exit_code == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert count(conn, "SELECT count(*) FROM job_runs") == 0


# -- 4: tracebacks that are one line now ---------------------------------------------------------

NOT_UTF8 = b'{"a": "caf\xe9"}\n'


def test_a_payload_file_that_is_not_utf8_is_one_line(db_url, conn, tmp_path):
    path = tmp_path / "payload.json"
    path.write_bytes(NOT_UTF8)
    result = run_cli("enqueue", "t", "--payload-file", str(path), "--database-url", db_url)
    _one_line_exit_2(result, "not UTF-8")
    assert count(conn, "SELECT count(*) FROM job_runs") == 0


def test_a_jsonl_file_that_is_not_utf8_is_one_line(db_url, conn, tmp_path):
    path = tmp_path / "runs.jsonl"
    path.write_bytes(b'{"type": "t"}\n{"type": "t", "payload": "caf\xe9"}\n')
    result = run_cli("enqueue", "--jsonl", str(path), "--database-url", db_url)
    assert "line 2" in _one_line_exit_2(result, "not UTF-8")
    assert count(conn, "SELECT count(*) FROM job_runs") == 0


def test_a_schedule_file_that_is_not_utf8_is_one_line(db_url, conn, tmp_path):
    path = tmp_path / "schedules.toml"
    path.write_bytes(b'[schedules.a]\ncron = "* * * * *"\ntype = "caf\xe9"\n')
    result = run_cli("schedule", "sync", str(path), "--database-url", db_url)
    _one_line_exit_2(result, "not UTF-8")
    assert count(conn, "SELECT count(*) FROM job_definitions") == 0


def test_a_number_of_thousands_of_digits_in_a_schedule_file_is_one_line(db_url, conn):
    digits = "9" * 5000
    for entry, message in [
        (f"priority = {digits}", "invalid TOML: a number too large"),
        (f'max_attempts = "{digits}"', "invalid max attempts '99999"),
    ]:
        text = f'[schedules.a]\ncron = "* * * * *"\ntype = "t"\n{entry}\n'
        result = run_cli("schedule", "sync", "-", "--database-url", db_url, input=text)
        assert len(_one_line_exit_2(result, message)) < 300
    assert count(conn, "SELECT count(*) FROM job_definitions") == 0


@pytest.mark.parametrize(
    ("cron", "message"),
    [
        ("9" * 5000 + " * * * *", "minute value '99999"),
        ("*/" + "1" * 5000 + " * * * *", "minute step '11111"),
        ("0 0 1-5/" + "1" * 5000 + " * *", "day-of-month step '11111"),
    ],
    ids=["value", "step", "range-step"],
)
def test_a_cron_field_of_thousands_of_digits_is_one_line(db_url, conn, tmp_path, cron, message):
    # Cron refuses a number it cannot read, a step as much as a value: no door reads one as
    # the field's first value.
    _one_line_exit_2(run_cli("schedule", "preview", cron), message)
    added = run_cli("schedule", "add", "a", "--cron", cron, "--type", "t", "--database-url", db_url)
    _one_line_exit_2(added, message)
    path = tmp_path / "schedules.toml"
    path.write_text(f'[schedules.a]\ncron = "{cron}"\ntype = "t"\n')
    _one_line_exit_2(run_cli("schedule", "sync", str(path), "--database-url", db_url), message)
    assert count(conn, "SELECT count(*) FROM job_definitions") == 0
    assert count(conn, "SELECT count(*) FROM job_audit") == 0


def test_toml_nested_thousands_deep_is_one_line(db_url, conn):
    text = "x = " + "[" * 5000 + "]" * 5000 + "\n"
    result = run_cli("schedule", "sync", "-", "--database-url", db_url, input=text)
    _one_line_exit_2(result, "invalid TOML")
    text = "x = " + "{a = " * 5000 + "1" + "}" * 5000 + "\n"
    result = run_cli("schedule", "sync", "-", "--database-url", db_url, input=text)
    _one_line_exit_2(result, "invalid TOML")


@pytest.mark.parametrize(
    "start", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59", "0001-01-01", "9999-12-31T23:00-05"]
)
def test_preview_from_near_the_ends_of_the_calendar_is_one_line(start):
    for zone in ("UTC", "America/New_York", "Pacific/Kiritimati"):
        result = run_cli("schedule", "preview", "* * * * *", "--from", start, "--timezone", zone)
        _one_line_exit_2(result, RANGE)


# -- 5: reading no more than the limit ----------------------------------------------------------


def _jobrunner_limited(*args: str, stdin=None, memory_mb: int = 400) -> tuple[int, str, int]:
    """Run `jobrunner ARGS` with its address space capped; (exit code, stderr, peak RSS KiB)."""

    def cap() -> None:
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    result = subprocess.run(
        # wait4() on a child forked from pytest would report at least pytest's own size.
        [sys.executable, "-c", PEAK_OF, sys.executable, "-m", "cronjob", *args],
        stdin=stdin if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        preexec_fn=cap,
        timeout=120,
    )
    return result.returncode, result.stderr.decode(errors="replace"), int(result.stdout)


@pytest.mark.parametrize(
    "args, message",
    [
        (["enqueue", "t", "--payload-file", "/dev/zero"], "too large"),
        (["enqueue", "--jsonl", "/dev/zero"], "longer than"),
        (["schedule", "sync", "/dev/zero"], "too large"),
    ],
)
def test_endless_input_is_refused_after_reading_the_limit(db_url, conn, args, message):
    code, stderr, _ = _jobrunner_limited(*args, "--database-url", db_url)
    assert code == 2, stderr
    assert message in stderr and len(stderr.strip().splitlines()) == 1
    assert count(conn, "SELECT count(*) FROM job_runs") == 0


def test_jsonl_chunks_are_bounded_in_bytes_as_well_as_runs():
    import io

    from cronjob.commands import runs

    payload = {"blob": "x" * 900_000}
    lines = "".join(json.dumps({"type": "t", "payload": payload}) + "\n" for _ in range(40))
    chunks = list(runs._jsonl_chunks(io.BytesIO(lines.encode())))
    assert sum(len(chunk) for chunk in chunks) == 40
    assert len(chunks) > 1
    for chunk in chunks:
        size = sum(len(run.payload_json) for run in chunk)
        assert size < runs.JSONL_CHUNK_BYTES + 1_000_000


def test_a_jsonl_batch_spanning_chunks_is_one_transaction(db_url, conn, monkeypatch):
    from cronjob.commands import runs

    monkeypatch.setattr(runs, "JSONL_CHUNK", 3)
    good = "".join(json.dumps({"type": "t", "payload": {"n": n}}) + "\n" for n in range(10))
    result = run_cli("enqueue", "--jsonl", "-", "--database-url", db_url, input=good + "{bad\n")
    _one_line_exit_2(result, "line 11")
    assert count(conn, "SELECT count(*) FROM job_runs") == 0
    result = run_cli("enqueue", "--jsonl", "-", "--database-url", db_url, input=good)
    assert result.exit_code == 0, result.stderr
    ids = [int(line) for line in result.stdout.split()]
    stored = conn.execute("SELECT id, payload->>'n' FROM job_runs ORDER BY id").fetchall()
    assert [(i, str(n)) for n, i in enumerate(ids)] == stored


def test_list_fetches_no_payloads_for_its_table_and_streams_them_for_json(db_url, conn):
    from cronjob.api import enqueue

    big = {"blob": "x" * 990_000}
    with conn.transaction():
        for _ in range(60):
            enqueue(conn, "t", big)
    code, stderr, table_kb = _jobrunner_limited(
        "list", "--limit", "1000", "--database-url", db_url, memory_mb=1000
    )
    assert code == 0, stderr
    code, stderr, json_kb = _jobrunner_limited(
        "list", "--limit", "1000", "--json", "--database-url", db_url, memory_mb=1000
    )
    assert code == 0, stderr
    # 60 MB of payloads: holding them all, decoded, would take several times that.
    assert table_kb < 100 * 1024, table_kb
    assert json_kb < 120 * 1024, json_kb


# -- 6: long bad values are echoed clipped --------------------------------------------------------

LONG = "p" * 5000

LONG_VALUES = {
    "run-at": ["enqueue", "t", "--run-at", LONG],
    "delay": ["enqueue", "t", "--delay", LONG],
    "max attempts": ["enqueue", "t", "--max-attempts", LONG],
    "priority": ["enqueue", "t", "--priority", LONG],
    "tenant": ["enqueue", "t", "--tenant", LONG],
    "idempotency key": ["enqueue", "t", "--idempotency-key", LONG],
    "type": ["enqueue", LONG],
    "run id": ["show", LONG],
    "list status": ["list", "--status", LONG],
    "list limit": ["list", "--limit", LONG],
    "prune status": ["prune", "--older-than", "1d", "--status", LONG],
    "check age": ["check", "--max-queue-age", LONG],
    "schedule name": ["schedule", "add", LONG, "--cron", "* * * * *", "--type", "t"],
    "timezone": ["schedule", "add", "a", "--cron", "* * * * *", "--type", "t", "--timezone", LONG],
    "cron": ["schedule", "add", "a", "--cron", LONG, "--type", "t"],
    "preview from": ["schedule", "preview", "* * * * *", "--from", LONG],
    "tick lease": ["tick", "--lease", LONG],
    "extra argument": ["show", "1", LONG],
    "unknown option": ["list", "--" + LONG],
}


@pytest.mark.parametrize("args", LONG_VALUES.values(), ids=LONG_VALUES.keys())
def test_a_long_bad_value_is_echoed_as_a_short_clipped_excerpt(db_url, conn, args):
    result = run_cli(*args, "--database-url", db_url)
    assert result.exit_code in (1, 2), result.stderr
    line = result.stderr.strip()
    assert "\n" not in line
    assert len(line) < 400, line
    assert count(conn, "SELECT count(*) FROM job_runs") == 0


@pytest.mark.parametrize(
    "field", ["run_at", "delay", "max_attempts", "priority", "tenant", "idempotency_key", "type"]
)
def test_a_long_bad_value_in_a_jsonl_line_is_echoed_clipped(db_url, conn, field):
    fields = {"type": "t", field: LONG if field != "tenant" else LONG * 2}
    if field in ("max_attempts", "priority"):
        fields[field] = [LONG]
    line = json.dumps(fields) + "\n" + json.dumps({"type": "t", LONG: 1}) + "\n"
    result = run_cli("enqueue", "--jsonl", "-", "--database-url", db_url, input=line)
    message = _one_line_exit_2(result, "line 1")
    assert len(message) < 400, message


def test_the_excerpt_of_any_value_is_short():
    from cronjob.inputs import excerpt

    for value in ("x" * 10**6, "\U0001f600" * 10**5, 10**5000, [1] * 10**5, {"a": LONG}, 1.5):
        assert len(excerpt(value)) <= 400


def test_schedule_files_are_read_no_further_than_their_limit(db_url, tmp_path: Path):
    from cronjob import definitions

    path = tmp_path / "big.toml"
    path.write_bytes(b"# " + b"x" * definitions.MAX_FILE_BYTES + b"\n")
    result = run_cli("schedule", "sync", str(path), "--database-url", db_url)
    _one_line_exit_2(result, f"more than {definitions.MAX_FILE_BYTES} bytes")
