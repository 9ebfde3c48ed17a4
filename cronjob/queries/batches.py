"""Batches in statements (migration 0026): made, ended when over, read by their callback, by
`batches` and `batch show`; a batch's members for an operator's retry and cancel; pruned.

Run by cronjob.store.batches. A member's finish ends its batch in the database itself (the
trigger job_runs_batch_member_finished, in the transaction of that finish): nothing here
runs on the tick's path but the callback's read of its batch.
"""

from __future__ import annotations

from cronjob.queries import _NOW

# The id first: the enqueuer may read nothing back, and its sequence it may draw from.
BATCH_INSERT_ID = "SELECT nextval('job_batches_id_seq')"

BATCH_INSERT = f"""
INSERT INTO job_batches (id, on_outcome, then_type, then_payload, then_tenant_id, then_priority,
                         then_max_attempts, created_at)
VALUES (%(id)s, %(on_outcome)s, %(then_type)s, %(then_payload)s::text::jsonb, %(then_tenant_id)s,
        coalesce(%(then_priority)s, 0), %(then_max_attempts)s, {_NOW})
"""

# The batches of a schedule's occurrences (`schedule add --then`), one per occurrence: the
# new ones, made as the occurrence's tenant runs are, under the definition's row lock.
BATCHES_INSERT_FOR_OCCURRENCES = f"""
INSERT INTO job_batches (then_type, then_payload, definition_id, scheduled_for, created_at)
SELECT %(then_type)s, jsonb_build_object('schedule', %(name)s::text), %(definition_id)s, s,
       {_NOW}
FROM unnest(%(scheduled_fors)s::timestamptz[]) AS s
ON CONFLICT (definition_id, scheduled_for) WHERE definition_id IS NOT NULL DO NOTHING
RETURNING id
"""

# A batch whose members have all ended already (none, or none it inserted) ends now, in the
# enqueue's transaction; any other answers at its first unfinished member.
BATCH_END = f"SELECT jobrunner_batch_end(%(id)s, {_NOW})"

_BATCH_COLUMNS = """b.id, b.on_outcome, b.then_type, b.definition_id, b.scheduled_for, b.created_at,
       b.ended_at, b.counts, coalesce(b.not_succeeded, '{}') AS not_succeeded, b.reason,
       b.callback_run_id"""

# What the callback's handler sees: its batch as it was when the callback was enqueued.
BATCH_GET_BY_CALLBACK = (
    f"SELECT {_BATCH_COLUMNS} FROM job_batches b WHERE b.callback_run_id = %(run_id)s"
)

# The batch a run is a member of (the run page links it).
BATCH_GET_ID_BY_MEMBER = "SELECT batch_id FROM job_runs WHERE id = %(run_id)s"

# A batch with its members' statuses now, counted on job_runs_batch.
_LIVE_COUNTS = """(SELECT coalesce(jsonb_object_agg(status, n), '{}')
        FROM (SELECT status, count(*) AS n FROM job_runs r
              WHERE r.batch_id = b.id GROUP BY status) s) AS live_counts"""
BATCH_GET = f"SELECT {_BATCH_COLUMNS}, {_LIVE_COUNTS} FROM job_batches b WHERE b.id = %(id)s"

BATCHES_LIST = f"""
SELECT {_BATCH_COLUMNS}, {_LIVE_COUNTS}
FROM job_batches b
ORDER BY b.id DESC
LIMIT %(limit)s
"""

# The members that did not succeed, beyond the hundred the batch keeps, for `batch show`.
BATCH_MEMBERS_LIST = """
SELECT id, status FROM job_runs
WHERE batch_id = %(id)s AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s))
ORDER BY id
LIMIT %(limit)s
"""

# Pruning: the batches that ended before the cutoff, whose members are all gone and whose
# callback has finished (its handler reads its batch) or is gone too.
BATCHES_PRUNE = f"""
DELETE FROM job_batches b
WHERE b.ended_at < {_NOW} - make_interval(secs => %(older_than)s)
  AND NOT EXISTS (SELECT 1 FROM job_runs r WHERE r.batch_id = b.id)
  AND NOT EXISTS (SELECT 1 FROM job_runs c WHERE c.id = b.callback_run_id
                  AND c.status NOT IN ('succeeded', 'dead', 'cancelled'))
"""
