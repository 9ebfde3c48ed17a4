"""The ceiling's statements.

The pgbench ceiling runs the tick's own claim and finalize, taken from
cronjob.queries.runs when the run starts (`pgbench_two_commit`, `pgbench_one_commit`):
it can never drift from what a tick sends. Only the parameters become pgbench
variables, and the claim's last SELECT hands back its ids as one array row so
that pgbench's gset can keep them for the finalize.

CLAIM and FINISH are the same statements reduced to their core, for the psycopg
client row and the growth section's claim probes: the same dispatch filter and
order, SKIP LOCKED batch, lease columns and token fence, without per-type leases
and attempt budgets, mixed outcomes or attempt history. If a tick's statements
change shape, change these with them.
"""

from __future__ import annotations

import re
import uuid

# A tick plans its claim with bitmap and sequential scans off (queries.runs.RUNS_CLAIM_MANY_PLAN),
# so a fresh, never analyzed table is still claimed by walking the dispatch index.
# The ceiling's clients and the growth section's claim probes set the same for their
# whole session.
CLAIM_PLAN_OPTIONS = "-c enable_bitmapscan=off -c enable_seqscan=off -c jit=off"

CLAIM = """\
WITH c AS MATERIALIZED (
    SELECT id FROM job_runs
    WHERE status IN ('queued', 'failed') AND run_at <= now() AND job_type = ANY(%(types)s)
    ORDER BY priority, run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE job_runs r
SET status = 'running', attempts = r.attempts + 1, locked_by = %(worker)s,
    locked_until = now() + make_interval(secs => 300), lease_token = (SELECT gen_random_uuid()),
    started_at = now(), updated_at = now()
FROM c WHERE r.id = c.id
RETURNING r.id, r.lease_token"""

FINISH = """\
UPDATE job_runs r
SET status = 'succeeded', finished_at = now(), updated_at = now(),
    locked_by = NULL, locked_until = NULL, lease_token = NULL
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS o(id, lease_token)
WHERE r.id = o.id AND r.lease_token = o.lease_token AND r.status = 'running'"""

ENQUEUE = "INSERT INTO job_runs (job_type, payload) SELECT 'noop', '{}' FROM generate_series(1, %s)"

UNFINISHED = "SELECT count(*) FROM job_runs WHERE status IN ('queued', 'running', 'failed')"

# 1,000,000 finished runs for the growth section: what a year of history looks like.
HISTORY = """\
INSERT INTO job_runs (job_type, payload, status, attempts, started_at, finished_at,
                      created_at, updated_at, lease_token)
SELECT 'noop', '{}', 'succeeded', 1, now(), now(), now(), now(), NULL
FROM generate_series(1, %s)"""


def _pgbench_params(sql: str) -> str:
    """psycopg placeholders as pgbench variables; the tick's `now` is always NULL."""
    sql = sql.replace("%(now)s", "NULL")
    return re.sub(r"%\((\w+)\)[sb]", r":\1", sql)


def tick_claim_for_pgbench() -> str:
    """queries.runs.RUNS_CLAIM_MANY whose final SELECT is wrapped to one row: the claimed ids,
    how many, and the finalize's other arrays for a batch of successes (the parameters a
    tick's finalize gets for it), all for pgbench's gset."""
    from cronjob.queries import runs

    final = runs._CLAIM_HAND_OVER
    if final not in runs.RUNS_CLAIM_MANY:
        raise RuntimeError("queries.runs.RUNS_CLAIM_MANY no longer ends as the ceiling expects")
    n = "count(*)::int"
    wrapped = (
        f"SELECT coalesce(array_agg(id), '{{}}') AS ids, {n} AS n,\n"
        f"       array_fill(%(token)s::uuid, ARRAY[{n}]) AS tokens,\n"
        f"       array_fill('succeeded'::text, ARRAY[{n}]) AS statuses,\n"
        f"       array_fill(0::float8, ARRAY[{n}]) AS delays,\n"
        f"       array_fill(NULL::text, ARRAY[{n}]) AS error_types,\n"
        f"       array_fill(NULL::text, ARRAY[{n}]) AS messages,\n"
        f"       array_fill(NULL::text, ARRAY[{n}]) AS tracebacks\n"
        f"FROM ({final}) AS handed"
    )
    # Every claim a full one, as a tick's first (pgbench passes no NULL variable).
    full = runs.RUNS_CLAIM_MANY.replace(runs._FLOORS, runs._NO_FLOORS)
    return _pgbench_params(full.replace(final, wrapped).strip())


def tick_finalize_for_pgbench() -> str:
    """queries.runs.RUNS_FINALIZE_MANY as it stands, its parameters as pgbench variables."""
    from cronjob.queries import runs

    return _pgbench_params(runs.RUNS_FINALIZE_MANY.strip())


def pgbench_variables(limit: int) -> dict[str, str]:
    """`-D` values: the claim's parameters (one no-op type, its lease and attempt budget)
    and an empty previous batch. One lease token serves the run: ids tell the batches
    apart, and the token only has to match between a claim and its finalize."""
    empty = "{}"
    return {
        "job_types": "{noop}",
        "leases": "{300}",
        "max_attempts": "{1}",
        "limit": str(limit),
        "worker": "pgbench",
        "token": str(uuid.uuid4()),
        "n": "1",  # "keep going" until a claim finds nothing
        # Every claim as a tick's first: the tenant walk's cursor at the lowest priority
        # there can be (store.runs), so the walk takes every tenant in order. (pgbench takes
        # no empty variable, and no run has that priority: the tenant does not matter.)
        "cursor_priority": str(-(2**31)),
        "cursor_tenant": "-",
        **{k: empty for k in ("ids", "tokens", "statuses", "delays")},
        **{k: empty for k in ("error_types", "messages", "tracebacks")},
    }


def pgbench_two_commit() -> str:
    """What a tick sends when it claims and finalizes apart: the claim in a transaction
    of its own, then the finalize of that batch in another. Each is one round trip, as
    in the tick, whose claim goes in one pipeline. A client stops once a claim is empty."""
    return (
        f"\\if :n > 0\n{tick_claim_for_pgbench()} \\gset\n{tick_finalize_for_pgbench()};\n\\endif\n"
    )


def pgbench_one_commit() -> str:
    """What a busy tick sends: finalize the previous batch and claim the next in one
    transaction (store.runs_finalize_and_claim_many). The tick pipelines the whole
    transaction into one round trip; pgbench cannot keep a result (gset) inside a
    pipeline, so here it is three: BEGIN with the finalize, the claim, COMMIT."""
    return (
        "\\if :n > 0\n"
        "\\startpipeline\n"
        "BEGIN;\n"
        f"{tick_finalize_for_pgbench()};\n"
        "\\endpipeline\n"
        f"{tick_claim_for_pgbench()} \\gset\n"
        "COMMIT;\n"
        "\\endif\n"
    )
