"""Batches: a callback enqueued exactly once, in the transaction of the last member's finish.

Real `jobrunner tick` processes drain a batch of 2,000 while one of them is killed mid-run;
their handlers (tests/handlers/batches.py) log every start and end with the wall clock, and
the callback logs what `ctx.batch` told it: the order of events is read from that log, never
from what the database says about itself. The race of two last members finishing at once is
played out on two connections, each step in an order the test chooses.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

import tests.handlers.batches  # noqa: F401 - registers the handlers for in-process ticks
from cronjob import enqueue, enqueue_batch, enqueue_batch_async, new_run
from cronjob.errors import BadInput
from tests.conftest import count, jobrunner_process, run_cli, wait_for
from tests.factories import tick

HANDLERS = "tests.handlers.batches"


def batch_of(conn: Any, payloads: list[dict[str, Any]], **then: Any) -> Any:
    on = then.pop("on", "finished")
    with conn.transaction():
        return enqueue_batch(
            conn,
            [new_run("batch.member", p) for p in payloads],
            then=new_run("batch.summary", {"report": "weekly"}, **then),
            on=on,
        )


def callbacks(conn: Any) -> list[tuple[int, str]]:
    return conn.execute(
        "SELECT id, status FROM job_runs WHERE job_type = 'batch.summary' ORDER BY id"
    ).fetchall()


def statuses(conn: Any, batch_id: int) -> dict[str, int]:
    rows = conn.execute(
        "SELECT status, count(*) FROM job_runs WHERE batch_id = %s GROUP BY status", [batch_id]
    )
    return dict(rows.fetchall())


class Hosts:
    """`n` hosts, each running `jobrunner tick` again and again (as cron would) until no run
    is left unfinished."""

    def __init__(self, db_url: str, log: Path, n: int) -> None:
        self.db_url, self.log = db_url, log
        self.errors: list[str] = []
        self.killed: list[int] = []
        self.threads = [threading.Thread(target=self._host) for _ in range(n)]
        for thread in self.threads:
            thread.start()

    def _left(self) -> int:
        with psycopg.connect(self.db_url) as conn:
            return count(conn, "SELECT count(*) FROM job_runs WHERE finished_at IS NULL")

    def _host(self) -> None:
        while self._left():
            process = jobrunner_process(
                "tick", "--database-url", self.db_url, "--handlers", HANDLERS,
                "--concurrency", "4", "--log-level", "warning",
                env={"JOBRUNNER_TEST_EXEC_LOG": str(self.log)},
            )  # fmt: skip
            _, stderr = process.communicate(timeout=300)
            if process.returncode == -9:
                self.killed.append(process.pid)
            elif process.returncode != 0:
                self.errors.append(stderr)
            time.sleep(0.05)

    def join(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self.threads), "the hosts did not finish"
        assert not self.errors, self.errors[0]


def read_log(log: Path) -> tuple[dict[tuple[int, int], list[float]], list[dict[str, Any]]]:
    """Each member execution's [start, end] (end missing: killed), and each callback's view."""
    executions: dict[tuple[int, int], list[float]] = {}
    called = []
    for line in log.read_text().splitlines():
        event, run_id, attempt, _pid, at, *rest = line.split(" ", 5)
        if event == "callback":
            called.append({"run_id": int(run_id), "at": float(at), **json.loads(rest[0])})
        else:
            executions.setdefault((int(run_id), int(attempt)), []).append(float(at))
    return executions, called


def test_a_batch_of_2000_drained_by_three_ticks_one_killed_calls_back_once_after_every_end(
    db_url, conn, tmp_path
):
    log = tmp_path / "exec.log"
    payloads: list[dict[str, Any]] = [{"seconds": 0.002} for _ in range(2000)]
    for i in range(0, 2000, 200):
        payloads[i + 7] = {"fail": True}  # ten members end dead
    payloads[1000] = {"kill": True}  # kills its tick mid-run, with others in flight
    batch = batch_of(conn, payloads)
    cancelled = batch.run_ids[1500:1505]
    assert run_cli("cancel", *map(str, cancelled), "--database-url", db_url).exit_code == 0

    hosts = Hosts(db_url, log, 3)
    hosts.join()

    assert len(hosts.killed) == 1
    executions, called = read_log(log)
    assert len(called) == 1
    [view] = called
    assert callbacks(conn) == [(view["run_id"], "succeeded")]
    ends = [times[-1] for times in executions.values() if len(times) == 2]
    assert view["at"] > max(ends)
    # Every member ran to an end but the cancelled ones; the one that killed its tick, and
    # the others in flight with it, ran again.
    ended = {run_id for (run_id, _), times in executions.items() if len(times) == 2}
    assert ended == set(batch.run_ids) - set(cancelled)
    assert any(len(times) == 1 for times in executions.values())
    final = statuses(conn, batch.id)
    assert final == {"succeeded": 1985, "dead": 10, "cancelled": 5}
    assert view["counts"] == final
    assert view["id"] == batch.id
    dead = [r for r, p in zip(batch.run_ids, payloads, strict=True) if p.get("fail")]
    assert view["not_succeeded"] == sorted(dead + cancelled)


def test_an_empty_batch_calls_back_at_once(db_url, conn):
    batch = batch_of(conn, [])
    assert batch.run_ids == []
    [(callback, status)] = callbacks(conn)
    assert status == "queued"
    tick(db_url, "batch.summary")
    assert callbacks(conn) == [(callback, "succeeded")]
    assert conn.execute("SELECT counts FROM job_batches").fetchone()[0] == {}


def test_the_callback_waits_for_the_last_member_and_sees_its_batch(db_url, conn, tmp_path):
    batch = batch_of(conn, [{}, {}, {"fail": True}], tenant_id="acme", priority=3)
    run_cli("cancel", str(batch.run_ids[0]), "--database-url", db_url)
    assert callbacks(conn) == []
    report = tick(db_url, "batch.member")
    assert report is not None
    [(callback, _)] = callbacks(conn)
    tenant, priority = conn.execute(
        "SELECT tenant_id, priority FROM job_runs WHERE id = %s", [callback]
    ).fetchone()
    assert (tenant, priority) == ("acme", 3)

    from cronjob import store

    state = store.batch_get_by_callback(conn, callback)
    assert state.id == batch.id
    assert state.counts == {"succeeded": 1, "dead": 1, "cancelled": 1}
    assert state.not_succeeded == [batch.run_ids[0], batch.run_ids[2]]
    assert state.ended_at >= state.started_at


def test_on_succeeded_with_a_dead_member_calls_nothing_back_and_says_why(db_url, conn):
    batch = batch_of(conn, [{}, {"fail": True}], on="succeeded")
    tick(db_url, "batch.member")
    assert callbacks(conn) == []
    reason, ended = conn.execute(
        "SELECT reason, ended_at FROM job_batches WHERE id = %s", [batch.id]
    ).fetchone()
    assert ended is not None
    assert reason == "no callback: 1 member(s) did not succeed (dead 1)"


def test_a_member_retried_after_the_callback_runs_again_without_a_second_callback(db_url, conn):
    batch = batch_of(conn, [{}, {"fail": True}])
    tick(db_url, "batch.member")
    assert len(callbacks(conn)) == 1
    conn.execute("UPDATE job_runs SET payload = '{}' WHERE id = %s", [batch.run_ids[1]])
    assert run_cli("retry", str(batch.run_ids[1]), "--database-url", db_url).exit_code == 0
    tick(db_url, "batch.member")
    assert statuses(conn, batch.id) == {"succeeded": 2}
    assert len(callbacks(conn)) == 1


def _finish(conn: Any, run_id: int) -> None:
    conn.execute(
        "UPDATE job_runs SET status = 'succeeded', finished_at = now() WHERE id = %s", [run_id]
    )


def test_two_last_members_finishing_at_once_call_back_exactly_once(db_url, conn):
    """The second finish is written while the first is in flight (its row locked by a
    transaction that has not committed): neither sees the other's finish in its snapshot."""
    a, b = batch_of(conn, [{}, {}]).run_ids
    with psycopg.connect(db_url) as first, psycopg.connect(db_url) as second:
        second.execute("SELECT 1 FROM job_runs WHERE id = %s FOR UPDATE", [b])  # b in flight
        _finish(first, a)  # sees b unfinished, and b's writer may not see a: waits its turn
        finishing = threading.Thread(target=lambda: (_finish(second, b), second.commit()))
        finishing.start()
        wait_for(
            lambda: count(
                conn,
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE 'UPDATE job_runs%%'",
            ),
            "the second finish to wait for the first's turn",
        )
        first.commit()
        finishing.join(20)
    assert len(callbacks(conn)) == 1


def test_a_finish_that_sees_another_member_unfinished_makes_that_finish_see_it(db_url, conn):
    a, b = batch_of(conn, [{}, {}]).run_ids
    with psycopg.connect(db_url) as first, psycopg.connect(db_url) as second:
        _finish(first, a)  # b is not in flight: a's finish is not the last
        finishing = threading.Thread(target=lambda: (_finish(second, b), second.commit()))
        finishing.start()
        wait_for(
            lambda: count(
                conn,
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE 'UPDATE job_runs%%'",
            ),
            "b's finish to wait for a's",
        )
        first.commit()
        finishing.join(20)
    assert len(callbacks(conn)) == 1


def test_a_batch_is_enqueued_in_the_callers_transaction_and_checked_first(db_url, conn):
    with pytest.raises(BadInput):
        batch_of(conn, [{}], on="sometimes")
    with pytest.raises(BadInput, match="takes no idempotency key"):
        batch_of(conn, [{}], idempotency_key="k")
    with pytest.raises(TypeError):
        enqueue_batch(conn, [new_run("batch.member"), {"type": "x"}], then=new_run("t"))
    with conn.transaction(force_rollback=True):
        enqueue_batch(conn, [new_run("batch.member")], then=new_run("batch.summary"))
    assert count(conn, "SELECT count(*) FROM job_batches") == 0
    assert count(conn, "SELECT count(*) FROM job_runs") == 0


def test_the_async_twin_enqueues_a_batch_in_the_callers_transaction(db_url, conn):
    async def enqueue() -> Any:
        async with await psycopg.AsyncConnection.connect(db_url) as aconn:
            batch = await enqueue_batch_async(
                aconn, [new_run("batch.member"), new_run("batch.member")],
                then=new_run("batch.summary"),
            )  # fmt: skip
            await aconn.commit()
            return batch

    batch = asyncio.run(enqueue())
    assert statuses(conn, batch.id) == {"queued": 2}
    tick(db_url, "batch.member")
    assert len(callbacks(conn)) == 1


# -- the command line ------------------------------------------------------------------


def jsonl(*payloads: dict[str, Any]) -> str:
    return "".join(json.dumps({"type": "batch.member", "payload": p}) + "\n" for p in payloads)


def test_enqueue_jsonl_then_makes_a_batch_and_prints_its_id(db_url, conn):
    result = run_cli(
        "enqueue", "--jsonl", "-", "--then", "batch.summary", "--then-payload", '{"week": 2}',
        "--database-url", db_url, input=jsonl({}, {}, {}),
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    batch_id = int(result.stdout)
    assert statuses(conn, batch_id) == {"queued": 3}
    as_json = run_cli(
        "enqueue", "--jsonl", "-", "--then", "batch.summary", "--json",
        "--database-url", db_url, input=jsonl({}, {}),
    )  # fmt: skip
    shown = json.loads(as_json.stdout)
    assert sorted(shown) == ["batch_id", "run_ids"] and len(shown["run_ids"]) == 2
    tick(db_url, "batch.member")
    assert len(callbacks(conn)) == 2
    # The first batch's callback, whichever batch ended first.
    payload = conn.execute(
        "SELECT r.payload FROM job_batches b JOIN job_runs r ON r.id = b.callback_run_id"
        " WHERE b.id = %s",
        [batch_id],
    ).fetchone()
    assert payload == ({"week": 2},)


def test_then_needs_jsonl_and_a_bad_line_writes_no_batch(db_url, conn):
    alone = run_cli("enqueue", "t", "--then", "x", "--database-url", db_url)
    assert alone.exit_code == 2 and "--then goes with --jsonl" in alone.stderr
    bad = run_cli(
        "enqueue", "--jsonl", "-", "--then", "batch.summary", "--database-url", db_url,
        input=jsonl({}) + "not json\n",
    )  # fmt: skip
    assert bad.exit_code == 2
    assert count(conn, "SELECT count(*) FROM job_batches") == 0
    assert count(conn, "SELECT count(*) FROM job_runs") == 0


def test_batches_and_batch_show_tell_progress_and_the_callback(db_url, conn):
    batch = batch_of(conn, [{}, {"fail": True}])
    listed = json.loads(run_cli("batches", "--json", "--database-url", db_url).stdout)
    assert [(b["id"], b["finished"], b["total"]) for b in listed] == [(batch.id, 0, 2)]
    tick(db_url, "batch.member")
    shown = json.loads(
        run_cli("batch", "show", str(batch.id), "--json", "--database-url", db_url).stdout
    )
    assert shown["counts"] == {"succeeded": 1, "dead": 1}
    assert shown["not_succeeded"] == [batch.run_ids[1]]
    assert shown["callback_run_id"] == callbacks(conn)[0][0]
    text = run_cli("batch", "show", str(batch.id), "--database-url", db_url).stdout
    assert "finished  2/2 (100%)" in text and f"callback  run {shown['callback_run_id']}" in text
    missing = run_cli("batch", "show", "999", "--database-url", db_url)
    assert missing.exit_code == 1 and "batch 999 not found" in missing.stderr


def test_retry_and_cancel_take_a_batch_and_are_audited(db_url, conn):
    batch = batch_of(conn, [{}, {}, {}])
    other = batch_of(conn, [{}])
    cancelled = run_cli("cancel", "--batch", str(batch.id), "--yes", "--database-url", db_url)
    assert cancelled.exit_code == 0, cancelled.stderr
    assert statuses(conn, batch.id) == {"cancelled": 3}
    assert statuses(conn, other.id) == {"queued": 1}
    assert len(callbacks(conn)) == 1  # the cancelled batch ended
    retried = run_cli("retry", "--batch", str(batch.id), "--yes", "--database-url", db_url)
    assert retried.exit_code == 0, retried.stderr
    assert statuses(conn, batch.id) == {"queued": 3}
    audit = conn.execute("SELECT command, selection FROM job_audit ORDER BY id").fetchall()
    assert [(c, s["batch"]) for c, s in audit] == [("cancel", batch.id), ("retry", batch.id)]
    tick(db_url, "batch.member")
    assert len(callbacks(conn)) == 2  # one per batch: the retried one does not fire again


# -- schedules fan out as batches -------------------------------------------------------

TENANTS_SQL = "SELECT id FROM batch_tenants"


def tenant_schedule(db_url: str, conn: Any, tenants: list[str]) -> None:
    conn.execute("DROP TABLE IF EXISTS batch_tenants")
    conn.execute("CREATE TABLE batch_tenants (id text)")
    for tenant in tenants:
        conn.execute("INSERT INTO batch_tenants VALUES (%s)", [tenant])
    added = run_cli(
        "schedule", "add", "weekly", "--cron", "* * * * *", "--type", "batch.member",
        "--payload", '{"seconds": 0.05}', "--scope", "tenant", "--then", "batch.summary",
        "--database-url", db_url,
    )  # fmt: skip
    assert added.exit_code == 0, added.stderr
    conn.execute(
        "UPDATE job_definitions SET materialized_through = %s, next_fire_at = %s",
        [AT(0, 30), AT(1)],
    )


def AT(minute: int, second: int = 0) -> datetime:
    return datetime(2031, 1, 6, 10, minute, second, tzinfo=UTC)


def test_a_tenant_schedule_with_then_calls_back_once_per_occurrence_after_its_runs(
    db_url, conn, tmp_path
):
    tenant_schedule(db_url, conn, ["acme", "globex", "initech"])
    tick(db_url, now=AT(1, 5), tenants_sql=TENANTS_SQL)  # materializes 10:01, runs nothing
    tick(db_url, now=AT(2, 5), tenants_sql=TENANTS_SQL)  # 10:02, while 10:01's runs wait
    assert count(conn, "SELECT count(*) FROM job_runs WHERE batch_id IS NOT NULL") == 6
    log = tmp_path / "exec.log"
    options = json.dumps({"types": ["batch.member", "batch.summary"], "concurrency": 2})
    ticks = [jobrunner_process_at(db_url, AT(2, 30), options, log) for _ in range(3)]
    for process in ticks:
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr
    # A tick that drained before the callbacks were due leaves them: one more takes them.
    last = jobrunner_process_at(db_url, AT(2, 30), options, log)
    _, stderr = last.communicate(timeout=120)
    assert last.returncode == 0, stderr

    executions, called = read_log(log)
    assert sorted(v["scheduled_for"] for v in called) == [AT(1).isoformat(), AT(2).isoformat()]
    members = dict(
        conn.execute("SELECT id, scheduled_for FROM job_runs WHERE batch_id IS NOT NULL")
    )
    for view in called:
        assert view["counts"] == {"succeeded": 3}
        ends = [
            times[-1] for (run_id, _), times in executions.items()
            if members[run_id].isoformat() == view["scheduled_for"]
        ]  # fmt: skip
        assert len(ends) == 3 and view["at"] > max(ends)
        assert view["payload"] == {"schedule": "weekly"}


def test_an_occurrence_with_no_tenant_still_calls_back(db_url, conn):
    tenant_schedule(db_url, conn, [])
    tick(db_url, now=AT(1, 5), tenants_sql=TENANTS_SQL)
    [(callback, status)] = callbacks(conn)
    assert status == "queued"
    scheduled_for, counts = conn.execute(
        "SELECT scheduled_for, counts FROM job_batches WHERE callback_run_id = %s", [callback]
    ).fetchone()
    assert (scheduled_for, counts) == (AT(1), {})
    tick(db_url, now=AT(1, 6), tenants_sql=TENANTS_SQL)  # materializing again adds nothing
    assert len(callbacks(conn)) == 1


def test_then_needs_a_tenant_schedule_and_is_read_from_the_schedule_file(db_url, conn, tmp_path):
    refused = run_cli(
        "schedule", "add", "g", "--cron", "@daily", "--type", "t", "--then", "s",
        "--database-url", db_url,
    )  # fmt: skip
    assert refused.exit_code == 2 and "scope tenant" in refused.stderr
    path = tmp_path / "schedules.toml"
    path.write_text(
        '[schedules.weekly]\ncron = "@weekly"\ntype = "reports.weekly"\nscope = "tenant"\n'
        'then = "reports.summary"\n'
    )
    synced = run_cli("schedule", "sync", str(path), "--database-url", db_url)
    assert synced.exit_code == 0, synced.stderr
    shown = json.loads(
        run_cli("schedule", "show", "weekly", "--json", "--database-url", db_url).stdout
    )
    assert shown["then"] == "reports.summary"


def jobrunner_process_at(db_url: str, now: datetime, options: str, log: Path) -> Any:
    import subprocess
    import sys

    from tests.conftest import ROOT

    env = {**os.environ, "JOBRUNNER_TEST_EXEC_LOG": str(log)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, "-m", "tests.tick_at", db_url, now.isoformat(),
         json.dumps({**json.loads(options), "tenants_sql": TENANTS_SQL})],
        env=env, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def test_pruning_removes_a_finished_batch_with_its_runs(db_url, conn):
    ended = batch_of(conn, [{}, {}])
    going = batch_of(conn, [{}])
    tick(db_url, "batch.member", "batch.summary")
    run_cli("enqueue", "batch.member", "--database-url", db_url)  # a run of no batch, waiting
    waiting = batch_of(conn, [{}])  # not finished: stays
    pruned = run_cli("prune", "--older-than", "0s", "--database-url", db_url)
    assert pruned.exit_code == 0, pruned.stderr
    assert count(conn, "SELECT count(*) FROM job_batches") == 1
    assert conn.execute("SELECT id FROM job_batches").fetchone()[0] == waiting.id
    assert {ended.id, going.id}.isdisjoint(
        {r[0] for r in conn.execute("SELECT DISTINCT batch_id FROM job_runs")}
    )


def test_a_batch_is_kept_while_its_callback_has_not_run(db_url, conn):
    batch = batch_of(conn, [{}])
    tick(db_url, "batch.member")  # the callback is queued, not run
    assert run_cli("prune", "--older-than", "0s", "--database-url", db_url).exit_code == 0
    assert count(conn, "SELECT count(*) FROM job_batches WHERE id = %s", batch.id) == 1


def _end(conn: Any, run_id: int, status: str = "succeeded") -> None:
    conn.execute(
        "UPDATE job_runs SET status = %s, finished_at = now() WHERE id = %s", [status, run_id]
    )


def test_pruning_keeps_the_finished_members_of_a_batch_that_has_not_ended(db_url, conn):
    """Its callback counts them when the last member ends."""
    first, second, last = batch_of(conn, [{}, {}, {}]).run_ids
    _end(conn, first)
    _end(conn, second, "dead")
    from cronjob.prune import prune_runs  # a tick's --prune-older-than

    assert prune_runs(conn, older_than=0).total == 0
    pruned = run_cli("prune", "--older-than", "0s", "--database-url", db_url)
    assert pruned.exit_code == 0, pruned.stderr
    assert count(conn, "SELECT count(*) FROM job_runs WHERE id IN (%s, %s)", first, second) == 2
    _end(conn, last)
    counts = conn.execute("SELECT counts FROM job_batches").fetchone()[0]
    assert counts == {"succeeded": 2, "dead": 1}


def test_pruning_takes_the_dependencies_of_the_runs_it_deletes(db_url, conn):
    a, b = batch_of(conn, [{}, {}]).run_ids
    waiting = enqueue_after(conn, a)
    also = enqueue(conn, "batch.member", {}, after=[a, b])
    _end(conn, a)
    _end(conn, waiting)
    _end(conn, b)  # the batch ends; `also` is due
    assert run_cli("prune", "--older-than", "0s", "--database-url", db_url).exit_code == 0
    left = conn.execute("SELECT parent_id, run_id FROM job_run_dependencies").fetchall()
    assert left == []  # a and b are gone, and with them every edge to `also`
    assert conn.execute("SELECT status FROM job_runs WHERE id = %s", [also]).fetchone() == (
        "queued",
    )


def test_a_tick_that_prunes_removes_an_ended_batch_with_its_runs(db_url, conn):
    batch = batch_of(conn, [{}, {}])
    result = run_cli(
        "tick", "--database-url", db_url, "--handlers", HANDLERS, "--prune-older-than", "0s"
    )
    assert result.exit_code == 0, result.stderr
    assert count(conn, "SELECT count(*) FROM job_runs") == 0
    assert count(conn, "SELECT count(*) FROM job_batches WHERE id = %s", batch.id) == 0


# -- members finished together: one call of the batch's function per statement (0026) --

FINISH_MANY = "UPDATE job_runs SET status = %s, finished_at = now() WHERE id = ANY(%s)"


def batch_calls(conn: Any) -> int:
    """How many times the batch trigger's function has run (track_functions = 'pl')."""
    return count(
        conn,
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions"
        " WHERE funcname = 'jobrunner_batch_member_finished'",
    )


def test_a_statement_that_finishes_many_members_calls_the_batch_once(db_url, conn):
    members = batch_of(conn, [{} for _ in range(50)]).run_ids
    with psycopg.connect(db_url) as tx:
        tx.execute("SET track_functions = 'pl'")
        tx.execute(FINISH_MANY, ["succeeded", members[:30]])
        tx.execute(FINISH_MANY, ["dead", members[30:]])
        calls = batch_calls(tx)
        tx.commit()
    assert calls == 3  # one a statement, and the guard's (the highest member: the last)
    assert len(callbacks(conn)) == 1
    assert conn.execute("SELECT counts FROM job_batches").fetchone()[0] == {
        "succeeded": 30, "dead": 20,
    }  # fmt: skip


def test_a_statement_that_leaves_the_guard_and_one_that_finishes_it_call_back_once(db_url, conn):
    """The first statement's call guards the highest unfinished member; the statement
    that finishes another member of the batch in the same transaction skips its probe, and
    the guard's own finish, later still, probes again and calls back."""
    a, b, c, d = batch_of(conn, [{}, {}, {}, {}]).run_ids
    with psycopg.connect(db_url) as tx:
        tx.execute(FINISH_MANY, ["succeeded", [a, b]])  # guards d
        tx.execute(FINISH_MANY, ["succeeded", [c]])
        assert callbacks(tx) == []
        tx.execute(FINISH_MANY, ["succeeded", [d]])
        tx.commit()
    assert len(callbacks(conn)) == 1


def test_one_statement_finishing_the_members_of_two_batches_in_turns_calls_back_both(db_url, conn):
    first = batch_of(conn, [{}, {}, {}]).run_ids
    second = batch_of(conn, [{}, {}, {}]).run_ids
    interleaved = [run for pair in zip(first, second, strict=True) for run in pair]
    conn.execute(
        "UPDATE job_runs r SET status = 'succeeded', finished_at = now()"
        " FROM unnest(%s::bigint[]) WITH ORDINALITY AS o(id, n) WHERE r.id = o.id",
        [interleaved],
    )
    assert len(callbacks(conn)) == 2


def test_a_member_cancelled_by_its_parents_death_in_the_statement_that_ends_the_rest(db_url, conn):
    """The parent's trigger cancels the waiting member in a statement of its own, nested in
    the outer one: the batch calls back once, counting it."""
    parent = enqueue(conn, "batch.member", {})
    with conn.transaction():
        batch = enqueue_batch(
            conn,
            [new_run("batch.member"), new_run("batch.member", after=[parent])],
            then=new_run("batch.summary"),
        )
    first, waiting = batch.run_ids
    conn.execute(FINISH_MANY, ["dead", [parent, first]])
    assert conn.execute("SELECT status FROM job_runs WHERE id = %s", [waiting]).fetchone() == (
        "cancelled",
    )
    assert len(callbacks(conn)) == 1
    counts = conn.execute("SELECT counts FROM job_batches WHERE id = %s", [batch.id]).fetchone()
    assert counts[0] == {"dead": 1, "cancelled": 1}


# -- the guide ------------------------------------------------------------------------


def test_the_guides_schedule_file_syncs(db_url, conn, tmp_path):
    import re

    from tests.conftest import ROOT

    guide = (ROOT / "docs/guides/batches.md").read_text()
    [toml] = re.findall(r"```toml\n(.*?)```", guide, re.S)
    path = tmp_path / "schedules.toml"
    path.write_text(toml)
    synced = run_cli("schedule", "sync", str(path), "--database-url", db_url)
    assert synced.exit_code == 0, synced.stderr
    shown = run_cli("schedule", "show", "weekly-reports", "--json", "--database-url", db_url)
    assert json.loads(shown.stdout)["then"] == "reports.summary"


def test_one_tick_that_finishes_a_batch_runs_its_callback_and_the_runs_it_released(db_url, conn):
    """The last finishes write what the tick's last claim could not see: it looks again."""
    batch = batch_of(conn, [{} for _ in range(600)])
    waiting = enqueue_after(conn, batch.run_ids[-1])
    process = jobrunner_process(
        "tick", "--database-url", db_url, "--handlers", HANDLERS, "--log-level", "warning"
    )
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    assert callbacks(conn)[0][1] == "succeeded"
    assert conn.execute("SELECT status FROM job_runs WHERE id = %s", [waiting]).fetchone() == (
        "succeeded",
    )


def test_one_tick_runs_the_callbacks_of_small_batches_whose_last_finishes_it_wrote_last(
    db_url, conn
):
    """A small batch's last finishes may still be buffered when the tick's claim comes back
    empty: they are written before the tick ends, and it looks once more. Each batch here
    has its own tick (no-op handlers, as cron would start one after each enqueue)."""
    for size in (1, 2, 5, 10, 10, 10):
        with conn.transaction():
            batch = enqueue_batch(
                conn, [new_run("noop") for _ in range(size)], then=new_run("noop")
            )
        process = jobrunner_process(
            "tick", "--database-url", db_url, "--handlers", "bench.noop_handlers",
            "--log-level", "warning",
        )  # fmt: skip
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr
        called = conn.execute(
            "SELECT c.status FROM job_batches b JOIN job_runs c ON c.id = b.callback_run_id"
            " WHERE b.id = %s",
            [batch.id],
        ).fetchone()
        assert called == ("succeeded",), f"a batch of {size}: its callback is {called}"


CALLED_BACK = (
    "SELECT count(*) FROM job_batches b JOIN job_runs c ON c.id = b.callback_run_id"
    " WHERE b.id = %s AND c.status = 'succeeded'"
)


def test_a_listening_tick_runs_each_callback_its_own_finishes_enqueued(db_url, conn):
    """The finishes that enqueue a callback are written after the tick's last claim came
    back: the tick looks once more before it sleeps, as nothing wakes it for its own write
    (nobody here waits for finishes: the test polls, as `jobrunner wait` would wake it)."""
    listening = jobrunner_process(
        "tick", "--listen", "--database-url", db_url, "--handlers", "bench.noop_handlers",
        "--log-level", "warning", "--max-runtime", "120s",
    )  # fmt: skip
    try:
        for _ in range(6):
            with conn.transaction():
                batch = enqueue_batch(
                    conn, [new_run("noop") for _ in range(10)], then=new_run("noop")
                )
            wait_for(lambda b=batch.id: count(conn, CALLED_BACK, b), "the batch's callback")
    finally:
        listening.terminate()
        listening.communicate(timeout=60)


def enqueue_after(conn: Any, parent: int) -> int:
    return enqueue(conn, "batch.member", {}, after=[parent])


def test_members_finished_in_one_transaction_call_back_once_whichever_is_last(db_url, conn):
    """A finish that skips its probe (the batch's guard is locked by its transaction) is
    covered by the guard's own finish, in the same transaction or a later one."""
    a, b, c = batch_of(conn, [{}, {}, {}]).run_ids
    with psycopg.connect(db_url) as tx:
        _finish(tx, a)  # probes: guards c (the highest unfinished), b skipped next
        _finish(tx, b)
        _finish(tx, c)  # the guard itself: probes again, and is the last
        tx.commit()
    assert len(callbacks(conn)) == 1
    d, e = batch_of(conn, [{}, {}]).run_ids
    with psycopg.connect(db_url) as tx:
        _finish(tx, d)  # guards e
        tx.commit()
    _finish(conn, e)
    assert len(callbacks(conn)) == 2


def test_show_says_a_runs_batch_its_part_in_it_and_the_batchs_counts(db_url, conn):
    batch = batch_of(conn, [{}, {}])
    first, second = batch.run_ids
    conn.execute("UPDATE job_runs SET status = 'dead', finished_at = now() WHERE id = %s", [first])
    shown = run_cli("show", str(second), "--database-url", db_url)
    assert shown.exit_code == 0, shown.stderr
    assert shown.stdout.split(f"\nbatch {batch.id}: ", 1)[1].splitlines()[:3] == [
        f"this run is a member (`jobrunner batch show {batch.id}`)",
        "  finished  1/2 (dead 1, queued 1)",
        "  callback  not yet",
    ]
    conn.execute(
        "UPDATE job_runs SET status = 'succeeded', finished_at = now() WHERE id = %s", [second]
    )
    [(callback, _)] = callbacks(conn)
    member = json.loads(run_cli("show", str(first), "--json", "--database-url", db_url).stdout)
    called = json.loads(run_cli("show", str(callback), "--json", "--database-url", db_url).stdout)
    assert member["batch"]["role"] == "member" and called["batch"]["role"] == "callback"
    for seen in (member["batch"], called["batch"]):
        assert seen["id"] == batch.id and seen["show"] == f"jobrunner batch show {batch.id}"
        assert seen["counts"] == {"dead": 1, "succeeded": 1}
        assert (seen["total"], seen["finished"], seen["callback_run_id"]) == (2, 2, callback)
    shown = run_cli("show", str(callback), "--database-url", db_url).stdout
    assert f"batch {batch.id}: this run is the callback" in shown
    assert f"  callback  run {callback}" in shown
