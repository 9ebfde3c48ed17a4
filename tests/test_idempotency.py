"""An idempotency key returns an existing run only when it is the same piece of work:
the same job type for the same tenant. Otherwise it is refused, naming the run."""

from __future__ import annotations

import json

import pytest

from cronjob import enqueue
from cronjob.errors import IdempotencyConflict
from tests.conftest import count, run_cli


def _enqueue(db_url: str, job_type: str, *extra: str):
    return run_cli("enqueue", job_type, "--idempotency-key", "k1", *extra, "--database-url", db_url)


def test_the_same_key_for_the_same_type_and_tenant_returns_the_existing_run(db_url, conn):
    for tenant in ("acme", "globex"):
        first = run_cli(
            "enqueue", "test.ok", "--idempotency-key", f"k-{tenant}", "--tenant", tenant,
            "--database-url", db_url,
        )  # fmt: skip
        again = run_cli(
            "enqueue", "test.ok", "--idempotency-key", f"k-{tenant}", "--tenant", tenant,
            "--database-url", db_url,
        )  # fmt: skip
        assert (first.exit_code, again.exit_code) == (0, 0)
        assert first.stdout == again.stdout
    assert count(conn, "SELECT count(*) FROM job_runs") == 2


@pytest.mark.parametrize(
    "first, second",
    [
        (("test.ok", "--tenant", "acme"), ("test.ok", "--tenant", "globex")),
        (("test.ok", "--tenant", "globex"), ("test.ok", "--tenant", "acme")),
        (("test.ok",), ("test.ok", "--tenant", "acme")),
        (("test.ok", "--tenant", "acme"), ("test.ok",)),
        (("test.ok",), ("test.fail",)),
    ],
)
def test_the_same_key_for_other_work_is_refused_naming_the_run(db_url, conn, first, second):
    created = _enqueue(db_url, *first)
    assert created.exit_code == 0
    refused = _enqueue(db_url, *second)
    assert refused.exit_code == 1
    assert refused.stdout == ""
    [line] = refused.stderr.splitlines()
    assert f"belongs to run {int(created.stdout)}" in line
    assert count(conn, "SELECT count(*) FROM job_runs") == 1


def test_a_conflict_within_a_batch_writes_nothing(db_url, conn):
    lines = [
        json.dumps({"type": "test.ok", "idempotency_key": "k", "tenant": "acme"}),
        json.dumps({"type": "test.ok", "idempotency_key": "k", "tenant": "globex"}),
    ]
    result = run_cli("enqueue", "--jsonl", "-", "--database-url", db_url, input="\n".join(lines))
    assert result.exit_code == 1
    assert "belongs to run" in result.stderr
    assert count(conn, "SELECT count(*) FROM job_runs") == 0


def test_the_python_api_refuses_a_key_taken_by_another_tenant(conn):
    first = enqueue(conn, "test.ok", idempotency_key="k", tenant_id="acme")
    assert enqueue(conn, "test.ok", idempotency_key="k", tenant_id="acme") == first
    with pytest.raises(IdempotencyConflict, match=f"belongs to run {first}"):
        enqueue(conn, "test.ok", idempotency_key="k", tenant_id="globex")
    with pytest.raises(IdempotencyConflict):
        enqueue(conn, "test.other", idempotency_key="k", tenant_id="acme")
