"""Bulk enqueue: `enqueue_many(conn, runs)` and `jobrunner enqueue --jsonl`.

Runs that hold no key go in by COPY, the others by the insert whose ON CONFLICT finds the
run that holds a key. Either way a run is the same row, the ids come back in input order,
and the caller's transaction decides whether any of it exists.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from cronjob import api, store
from cronjob.api import enqueue_many, new_run
from cronjob.commands import runs as run_commands
from tests.conftest import count, run_cli

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
# What a run is, but its id and its result id (unique: each path gets its own).
COLUMNS = (
    "job_type, payload, tenant_id, status, attempts, max_attempts, priority, run_at,"
    " idempotency_key, unique_key, queue, run_after, traceparent, tracestate, created_at,"
    " updated_at, definition_id, scheduled_for, finished_at, locked_by, exclusive"
)


def every_option(result_ids: bool = False) -> list[Any]:
    """Runs that between them set every option a run without a key can have."""
    at = datetime(2030, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    runs = [
        new_run("plain"),
        new_run("paid", {"user": 7, "note": "tab\there, back\\slash, line\nbreak, é"}),
        new_run("soon", delay=90),
        new_run("odd", delay=0.0000025),  # half a microsecond: rounded as the server rounds
        new_run("later", run_at=at, priority=-3, max_attempts=9, tenant_id="acme"),
        new_run("task", queue="default", run_after=at, tenant_id=42),
        new_run("traced", traceparent=TRACEPARENT, tracestate="vendor=1"),
        new_run("line\tbreak\\type", [1, "two", None]),
    ]
    if result_ids:
        runs.append(new_run("task", queue="default", result_id=uuid.uuid4()))
    return runs


def rows(conn: psycopg.Connection[Any], ids: list[int]) -> list[tuple[Any, ...]]:
    found = conn.execute(f"SELECT id, {COLUMNS} FROM job_runs WHERE id = ANY(%s)", [ids]).fetchall()
    by_id = {row[0]: row[1:] for row in found}
    return [by_id[run_id] for run_id in ids]


@pytest.mark.parametrize("now", [None, datetime(2029, 1, 2, 3, 4, 5, tzinfo=UTC)])
def test_a_copied_run_is_the_row_the_insert_writes(db_url, now):
    runs = every_option()
    with psycopg.connect(db_url) as conn:  # one transaction: one now() for both
        inserted = [e.id for e in store.runs_insert_many(conn, runs, now=now)]
        copied = store.runs_copy_many(conn, runs, now=now)
        assert rows(conn, copied) == rows(conn, inserted)


def test_runs_that_set_no_option_are_copied_as_the_insert_writes_them(db_url):
    runs = [new_run("plain", {"i": i}) for i in range(3)]
    runs.append(new_run("tab\tand\\slash", {"note": "line\nbreak, \\, é, \u2028"}))
    with psycopg.connect(db_url) as conn:
        inserted = [e.id for e in store.runs_insert_many(conn, runs)]
        copied = store.runs_copy_many(conn, runs)
        assert rows(conn, copied) == rows(conn, inserted)


def test_every_column_the_insert_computes_a_copy_computes_too():
    from cronjob.run_options import RUN_OPTIONS

    computed = {name for name, option in RUN_OPTIONS.items() if option.expression}
    assert computed == {name for name, option in RUN_OPTIONS.items() if option.copied}


def test_a_result_id_is_copied(db_url, conn):
    wanted = uuid.uuid4()
    [run_id] = store.runs_copy_many(conn, [new_run("task", queue="q", result_id=wanted)])
    assert conn.execute("SELECT result_id FROM job_runs WHERE id = %s", [run_id]).fetchone() == (
        wanted,
    )


def test_a_run_with_a_key_is_not_copied(db_url, conn):
    with pytest.raises(ValueError, match="hold no key"):
        store.runs_copy_many(conn, [new_run("t"), new_run("t", idempotency_key="k")])
    assert count(conn, "SELECT count(*) FROM job_runs") == 0


def test_enqueue_many_copies_the_runs_that_hold_no_key(db_url, conn, monkeypatch):
    def no_insert(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("inserted, not copied")

    monkeypatch.setattr(store, "runs_insert_many", no_insert)
    runs = [new_run("t", {"i": i}, priority=i % 3) for i in range(api.COPY_AT_LEAST)]
    assert len(enqueue_many(conn, runs)) == api.COPY_AT_LEAST
    assert count(conn, "SELECT count(*) FROM job_runs") == api.COPY_AT_LEAST


def test_enqueue_many_returns_each_runs_id_in_input_order(db_url, conn, monkeypatch):
    monkeypatch.setattr(api, "ENQUEUE_CHUNK", 25)
    ids = enqueue_many(conn, (new_run("t", {"i": i}) for i in range(100)))
    payloads = dict(conn.execute("SELECT id, payload->>'i' FROM job_runs").fetchall())
    assert [payloads[run_id] for run_id in ids] == [str(i) for i in range(100)]


def test_enqueue_many_keeps_idempotency_and_unique_keys_among_copied_runs(
    db_url, conn, monkeypatch
):
    monkeypatch.setattr(api, "ENQUEUE_CHUNK", 20)
    [held] = enqueue_many(conn, [new_run("t", idempotency_key="held-before")])
    runs = [new_run("t", {"i": i}) for i in range(100)]
    runs[10] = new_run("t", {"i": 10}, idempotency_key="K")
    runs[55] = new_run("t", {"i": 55}, idempotency_key="K")  # a later chunk: the same run
    runs[70] = new_run("t", {"i": 70}, idempotency_key="held-before")
    runs[80] = new_run("t", {"i": 80}, unique_key="U")
    runs[99] = new_run("t", {"i": 99}, unique_key="U", replace=True)

    ids = enqueue_many(conn, runs)

    assert ids[55] == ids[10] and ids[70] == held and ids[99] == ids[80]
    assert len(set(ids)) == 98
    assert count(conn, "SELECT count(*) FROM job_runs") == 98
    payloads = dict(conn.execute("SELECT id, payload->>'i' FROM job_runs").fetchall())
    assert [payloads[ids[i]] for i in (0, 19, 20, 40, 98)] == ["0", "19", "20", "40", "98"]
    assert payloads[ids[80]] == "99"  # replaced: a debounce


def test_enqueue_many_in_a_rolled_back_transaction_enqueues_nothing(db_url, conn):
    with pytest.raises(RuntimeError), conn.transaction():
        ids = enqueue_many(conn, [new_run("t", {"i": i}) for i in range(500)])
        assert len(ids) == 500
        raise RuntimeError("the app's transaction fails")
    assert count(conn, "SELECT count(*) FROM job_runs") == 0


def test_enqueue_many_of_nothing_is_nothing(db_url, conn):
    assert enqueue_many(conn, []) == []


def test_jsonl_of_keyed_and_plain_lines_prints_ids_in_input_order(db_url, conn, monkeypatch):
    monkeypatch.setattr(run_commands, "JSONL_CHUNK", 30)
    lines = [{"type": "t", "payload": {"i": i}} for i in range(200)]
    for i in (5, 90, 150):
        lines[i]["idempotency_key"] = "same"
    lines[120]["unique_key"] = "u"
    lines[121]["unique_key"] = "u"
    text = "\n".join(json.dumps(line) for line in lines)

    result = run_cli("enqueue", "--jsonl", "-", "--database-url", db_url, input=text)

    assert result.exit_code == 0, result.stderr
    ids = [int(line) for line in result.stdout.split()]
    assert ids[5] == ids[90] == ids[150] and ids[120] == ids[121]
    assert count(conn, "SELECT count(*) FROM job_runs") == 197
    payloads = dict(conn.execute("SELECT id, payload->>'i' FROM job_runs").fetchall())
    firsts = [i for i in range(200) if i not in (90, 150, 121)]
    assert [payloads[ids[i]] for i in firsts] == [str(i) for i in firsts]


def test_jsonl_records_the_callers_trace_on_every_copied_run(db_url, conn):
    lines = "\n".join(json.dumps({"type": "t", "delay": "1h"}) for _ in range(50))
    result = run_cli(
        "enqueue",
        "--jsonl",
        "-",
        "--database-url",
        db_url,
        input=lines,
        env={"TRACEPARENT": TRACEPARENT, "TRACESTATE": "vendor=1"},
    )
    assert result.exit_code == 0, result.stderr
    traced = conn.execute(
        "SELECT count(*) FROM job_runs WHERE traceparent = %s AND tracestate = 'vendor=1'"
        " AND run_at - created_at = interval '1 hour'",
        [TRACEPARENT],
    ).fetchone()[0]
    assert traced == 50


def test_jsonl_with_a_bad_line_after_copied_chunks_enqueues_nothing(db_url, conn, monkeypatch):
    monkeypatch.setattr(run_commands, "JSONL_CHUNK", 20)
    lines = [json.dumps({"type": "t", "payload": {"i": i}}) for i in range(100)]
    lines.append('{"type": "t", "priority": "high"}')
    result = run_cli("enqueue", "--jsonl", "-", "--database-url", db_url, input="\n".join(lines))
    assert result.exit_code == 2
    assert "line 101" in result.stderr and "high" in result.stderr
    assert count(conn, "SELECT count(*) FROM job_runs") == 0


def test_a_delay_is_counted_from_the_transactions_clock(db_url):
    with psycopg.connect(db_url) as conn:
        [run_id] = store.runs_copy_many(conn, [new_run("t", delay="2h")])
        due, started = conn.execute(
            "SELECT run_at, now() FROM job_runs WHERE id = %s", [run_id]
        ).fetchone()
        assert due - started == timedelta(hours=2)


@pytest.mark.parametrize("as_generator", [False, True])
def test_a_dict_in_place_of_a_run_is_a_type_error_naming_new_run_before_anything_is_sent(
    db_url, as_generator
):
    given = [new_run("fine", {"i": 1}), {"job_type": "email", "payload": {"to": "a@b.c"}}]
    runs = (run for run in given) if as_generator else given
    with psycopg.connect(db_url) as conn:
        before = count(conn, "SELECT count(*) FROM job_runs")
        with pytest.raises(TypeError) as raised:
            enqueue_many(conn, runs)
        assert str(raised.value) == (
            "enqueue_many() takes runs made by new_run(job_type, payload, ...), not dict "
            "(run 1): enqueue_many(conn, [new_run(...), ...])"
        )
        # The transaction is still usable: nothing failed on the server.
        assert count(conn, "SELECT count(*) FROM job_runs") == before


class Counting:
    """A connection that counts the statements sent through it: a keyed chunk's insert learns
    which run holds each key in the same statement, one round trip."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.statements: list[str] = []

    def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        self.statements.append(str(query))
        return self.conn.execute(query, *args, **kwargs)

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        return CountingCursor(self, self.conn.cursor(*args, **kwargs))


class CountingCursor:
    def __init__(self, counting: Counting, cursor: Any) -> None:
        self.counting, self.cursor = counting, cursor

    def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        self.counting.statements.append(str(query))
        return self.cursor.execute(query, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cursor, name)


def test_each_chunk_of_keyed_runs_is_one_statement(db_url, conn, monkeypatch):
    monkeypatch.setattr(api, "ENQUEUE_CHUNK", 20)
    held = enqueue_many(conn, [new_run("t", idempotency_key=f"k{i}") for i in range(0, 50, 7)])
    runs = [new_run("t", {"i": i}, idempotency_key=f"k{i % 50}") for i in range(60)]
    runs[30] = new_run("t", unique_key="u")
    counting = Counting(conn)

    ids = enqueue_many(counting, runs)  # type: ignore[arg-type]

    assert len(counting.statements) == 1 + 3  # the keyed batches' lock, and a chunk a statement
    assert [ids[i] for i in range(0, 50, 7)] == held and ids[50:] == ids[:10]
    assert count(conn, "SELECT count(*) FROM job_runs") == 8 + 41 + 1


def test_runs_holding_both_kinds_of_key_each_get_the_run_that_holds_their_keys(db_url, conn):
    runs = [
        new_run("t", {"n": 1}, idempotency_key="K1", unique_key="U"),
        new_run("t", {"n": 2}, idempotency_key="K2", unique_key="U"),  # U is the first's
        new_run("t", {"n": 3}, idempotency_key="K2", unique_key="V"),  # K2 is free: inserted
    ]

    first, second, third = enqueue_many(conn, runs)

    assert second == third != first
    payloads = dict(conn.execute("SELECT id, payload->>'n' FROM job_runs").fetchall())
    assert payloads == {first: "1", third: "3"}


def test_a_result_id_another_run_has_is_refused(db_url, conn):
    from cronjob.api import enqueue
    from cronjob.errors import BadInput

    taken = uuid.uuid4()
    enqueue(conn, "task", result_id=taken)
    with pytest.raises(BadInput, match="result id"), conn.transaction():
        enqueue(conn, "task", result_id=taken)
    assert count(conn, "SELECT count(*) FROM job_runs") == 1
