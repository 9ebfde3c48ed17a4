"""The raw-SQL ceiling's claim and finish: a tick's statements reduced to their core.

The same dispatch filter and order, SKIP LOCKED batch, lease columns and token
fence as cronjob.queries; without what a runner adds around them (per-type leases
and attempt budgets, mixed outcomes, attempt history). If a tick's statements
change shape, change these with them: the ceiling is only meaningful while it
does the database work a tick does.
"""

from __future__ import annotations

# A tick plans its claim with bitmap and sequential scans off (queries.RUNS_CLAIM_MANY_PLAN),
# so a fresh, never analyzed table is still claimed by walking the dispatch index.
# The ceiling's clients and the growth section's claim probes set the same for their
# whole session.
CLAIM_PLAN_OPTIONS = "-c enable_bitmapscan=off -c enable_seqscan=off"

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


def pgbench_script(limit: int, worker: str = "pgbench") -> str:
    """The same claim and finish for `pgbench -M extended`: the claim is wrapped so
    its ids and tokens come back as two arrays that \\gset can hold."""
    claim = (
        CLAIM.replace("%(types)s", "ARRAY['noop']")
        .replace("%(limit)s", str(limit))
        .replace("%(worker)s", f"'{worker}'")
    )
    finish = FINISH.replace("%(ids)s", ":ids").replace("%(tokens)s", ":tokens")
    return (
        f"WITH u AS (\n{claim}\n)\n"
        "SELECT coalesce(array_agg(id), '{}') AS ids,"
        " coalesce(array_agg(lease_token), '{}') AS tokens FROM u \\gset\n"
        f"{finish};\n"
    )
