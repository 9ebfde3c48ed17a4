"""An idempotency key is unique per (job type, tenant), forever: the same key for the same
type and tenant returns the existing run; a key another type or tenant holds is another
piece of work, with a run of its own."""

from __future__ import annotations

import asyncio
import json
import threading

import psycopg

from cronjob import enqueue
from tests.conftest import count, run_cli


def _enqueue(db_url: str, job_type: str, *extra: str) -> int:
    result = run_cli(
        "enqueue", job_type, "--idempotency-key", "K", *extra, "--database-url", db_url
    )
    assert result.exit_code == 0, result.stderr
    return int(result.stdout)


def test_the_same_key_for_the_same_type_and_tenant_returns_the_existing_run(db_url, conn):
    for tenant in ("acme", "globex"):
        first = _enqueue(db_url, "test.ok", "--tenant", tenant)
        assert _enqueue(db_url, "test.ok", "--tenant", tenant) == first
    first = _enqueue(db_url, "test.ok")
    assert _enqueue(db_url, "test.ok") == first
    assert count(conn, "SELECT count(*) FROM job_runs") == 3


def test_a_key_another_tenant_or_type_holds_enqueues_a_run_of_its_own(db_url, conn):
    acme = _enqueue(db_url, "test.ok", "--tenant", "acme")

    globex = _enqueue(db_url, "test.ok", "--tenant", "globex")
    no_tenant = _enqueue(db_url, "test.ok")
    other_type = _enqueue(db_url, "test.fail", "--tenant", "acme")

    assert len({acme, globex, no_tenant, other_type}) == 4
    assert _enqueue(db_url, "test.ok", "--tenant", "acme") == acme
    assert _enqueue(db_url, "test.ok", "--tenant", "globex") == globex
    assert _enqueue(db_url, "test.ok") == no_tenant
    assert _enqueue(db_url, "test.fail", "--tenant", "acme") == other_type
    assert count(conn, "SELECT count(*) FROM job_runs") == 4


def test_an_empty_tenant_is_a_tenant_and_no_tenant_is_another(conn):
    # The index reads no tenant as '': a run for the tenant '' shares its key with runs
    # for no tenant, as it always has in the occurrence index.
    none = enqueue(conn, "test.ok", idempotency_key="K")
    assert enqueue(conn, "test.ok", idempotency_key="K", tenant_id="acme") != none
    assert enqueue(conn, "test.ok", idempotency_key="K") == none


def test_a_batch_enqueues_one_run_per_type_and_tenant_for_a_shared_key(db_url, conn):
    lines = [
        {"type": "test.ok", "idempotency_key": "K", "tenant": "acme"},
        {"type": "test.ok", "idempotency_key": "K", "tenant": "globex"},
        {"type": "test.ok", "idempotency_key": "K", "tenant": "acme"},
        {"type": "test.fail", "idempotency_key": "K", "tenant": "acme"},
        {"type": "test.ok", "idempotency_key": "K"},
    ]
    stdin = "\n".join(json.dumps(line) for line in lines)
    result = run_cli("enqueue", "--jsonl", "-", "--database-url", db_url, input=stdin)
    assert result.exit_code == 0, result.stderr
    acme, globex, acme_again, other_type, no_tenant = map(int, result.stdout.split())

    assert acme_again == acme
    assert len({acme, globex, other_type, no_tenant}) == 4
    assert count(conn, "SELECT count(*) FROM job_runs") == 4


def test_the_python_api_returns_the_run_of_the_same_type_and_tenant_only(conn):
    acme = enqueue(conn, "test.ok", idempotency_key="K", tenant_id="acme")
    globex = enqueue(conn, "test.ok", idempotency_key="K", tenant_id="globex")
    other = enqueue(conn, "test.other", idempotency_key="K", tenant_id="acme")

    assert len({acme, globex, other}) == 3
    assert enqueue(conn, "test.ok", idempotency_key="K", tenant_id="acme") == acme
    assert enqueue(conn, "test.other", idempotency_key="K", tenant_id="acme") == other


def test_a_key_committed_while_waiting_returns_that_run_not_another_tenants(db_url, conn):
    globex = enqueue(conn, "test.ok", idempotency_key="K", tenant_id="globex")
    with psycopg.connect(db_url) as holder:
        held = enqueue(holder, "test.ok", idempotency_key="K", tenant_id="acme")
        found: list[int] = []
        waiting = threading.Thread(
            target=lambda: found.append(
                enqueue(conn, "test.ok", idempotency_key="K", tenant_id="acme")
            )
        )
        waiting.start()
        _wait_until_blocked(db_url)
        holder.commit()
        waiting.join(timeout=30)

    assert found == [held] != [globex]
    assert count(conn, "SELECT count(*) FROM job_runs") == 2


def test_an_async_enqueue_of_a_key_committed_while_waiting_returns_that_run(db_url, conn):
    from cronjob import enqueue_async

    async def enqueue_waiting() -> int:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as aconn:
            return await enqueue_async(aconn, "test.ok", idempotency_key="K", tenant_id="acme")

    with psycopg.connect(db_url) as holder:
        held = enqueue(holder, "test.ok", idempotency_key="K", tenant_id="acme")
        found: list[int] = []
        waiting = threading.Thread(target=lambda: found.append(asyncio.run(enqueue_waiting())))
        waiting.start()
        _wait_until_blocked(db_url)
        holder.commit()
        waiting.join(timeout=30)

    assert found == [held]
    assert count(conn, "SELECT count(*) FROM job_runs") == 1


def _wait_until_blocked(db_url: str) -> None:
    from tests.conftest import wait_for

    with psycopg.connect(db_url, autocommit=True) as watcher:
        wait_for(
            lambda: watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database()"
            ).fetchone()[0],
            "the second enqueue to wait on the first one's key",
        )
