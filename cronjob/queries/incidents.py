"""An operator acting on sets of runs: selections to count, retry, cancel or prune in
batches, paused job types, and the audit trail of every such command.

Run by cronjob.store.incidents. Retry and cancel change a run as they do when it is named
by id (queries.runs): `_RETRY_SET` and `_CANCEL_SET`.
"""

from __future__ import annotations

from cronjob.queries import (
    _AUDIT_ENTRIES,
    _CANCEL_SET,
    _NOW,
    _RETRY_LOCKED,
    _RETRY_SET,
    _RETRY_SUPERSEDED,
)

# A selection of runs, as `retry`, `cancel` and `prune` take it: each criterion is
# NULL when not given. `eligible` is what the command may act on (cancel: runs not
# finished; prune: finished ones), so a dry run counts exactly what the command changes.
# The error text matches as a case-insensitive substring, not a LIKE pattern: an
# operator pastes a message, and `_` or `%` in it must mean themselves.
_SELECTED = """
    status = ANY(%(eligible)s::text[])
    AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
    AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
    AND (%(job_types)s::text[] IS NULL OR job_type = ANY(%(job_types)s::text[]))
    AND (%(tenants)s::text[] IS NULL OR tenant_id = ANY(%(tenants)s::text[]))
    AND (%(error_types)s::text[] IS NULL OR error_type = ANY(%(error_types)s::text[]))
    AND (%(error_like)s::text IS NULL
         OR strpos(lower(last_error), lower(%(error_like)s::text)) > 0)
    AND (%(definition_id)s::bigint IS NULL OR definition_id = %(definition_id)s::bigint)
    AND (%(batch_id)s::bigint IS NULL OR batch_id = %(batch_id)s::bigint)
    AND (%(since)s::timestamptz IS NULL
         OR coalesce(finished_at, updated_at) >= %(since)s::timestamptz)
    AND (%(until)s::timestamptz IS NULL
         OR coalesce(finished_at, updated_at) < %(until)s::timestamptz)
"""

# What a selection holds, up to its limit, in the order the command would walk it.
RUNS_COUNT_SELECTED = f"""
WITH selected AS (
    SELECT id, status FROM job_runs WHERE {_SELECTED}
    ORDER BY id
    LIMIT %(limit)s
)
SELECT status, count(*) AS runs, (array_agg(id ORDER BY id))[1:%(sample)s] AS sample_ids
FROM selected GROUP BY status ORDER BY status
"""


def _batch(change: str, *, locked: str = "id, status", then: str = "") -> str:
    """One batch of a selection: the next `limit` rows after id `after`, locked (their
    columns `locked`), changed, and `then` (more CTEs, each after a comma) written.

    Walking by id, each batch resumes where the last stopped, so the whole command reads
    the table once. Locks are held for one batch, its own transaction. A row that
    changed while the batch waited for its lock is checked again against the selection
    (FOR UPDATE re-reads it), and LIMIT counts only the rows that pass.
    """
    return f"""
WITH target AS MATERIALIZED (
    SELECT {locked} FROM job_runs
    WHERE {_SELECTED} AND id > %(after)s
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE
),
changed AS (
{change}
){then}
SELECT (SELECT max(id) FROM target) AS last_id,
       coalesce(array_agg(id ORDER BY id), '{{}}') AS ids,
       coalesce(array_agg(status ORDER BY id), '{{}}') AS statuses
FROM changed
"""


# As RUNS_RETRY_MANY, for a batch of a selection.
RUNS_RETRY_SELECTED = _batch(
    f"""
    UPDATE job_runs r {_RETRY_SET}
    FROM target t
    WHERE r.id = t.id
    RETURNING r.id, t.status
""",
    locked=_RETRY_LOCKED,
    then=f",{_RETRY_SUPERSEDED}",
)

# As RUNS_CANCEL_MANY: a running run's handler learns it at its next heartbeat.
RUNS_CANCEL_SELECTED = _batch(f"""
    UPDATE job_runs r {_CANCEL_SET}
    FROM target t
    WHERE r.id = t.id
    RETURNING r.id, t.status
""")

# Attempts and dependencies go with their run (ON DELETE CASCADE). A member of a batch
# that has not ended stays, as with RUNS_PRUNE_BATCH: its callback counts it.
RUNS_PRUNE_SELECTED = _batch("""
    DELETE FROM job_runs r USING target t
    WHERE r.id = t.id
      AND NOT EXISTS (SELECT 1 FROM job_batches b WHERE b.id = r.batch_id AND b.ended_at IS NULL)
    RETURNING r.id, t.status
""")

JOB_TYPE_PAUSES_LIST = """
SELECT job_type, reason, paused_by, paused_at FROM job_type_pauses ORDER BY job_type
"""

# Pausing a paused type again keeps its first pause: when it began, and why.
JOB_TYPES_PAUSE = f"""
INSERT INTO job_type_pauses (job_type, reason, paused_by, paused_at)
SELECT t, %(reason)s, %(actor)s, {_NOW} FROM unnest(%(job_types)s::text[]) AS t
ON CONFLICT (job_type) DO NOTHING
RETURNING job_type
"""

JOB_TYPES_RESUME = """
DELETE FROM job_type_pauses WHERE job_type = ANY(%(job_types)s::text[])
RETURNING job_type
"""

# One row per state-changing command (migration 0009), append-only (0016): its time and the
# database login are the server's (a trigger sets them), its actor the one declared.
AUDIT_INSERT = """
INSERT INTO job_audit (actor, command, selection, changed, sample_ids, reason)
VALUES (%(actor)s, %(command)s, %(selection)s::jsonb, %(changed)s, %(sample_ids)s::bigint[],
        %(reason)s)
RETURNING id
"""

# A later batch of the same command, appended in that batch's commit: an entry is never
# updated. The trigger refuses a batch for an entry another login recorded.
AUDIT_BATCH_INSERT = """
INSERT INTO job_audit_batches (audit_id, changed, sample_ids)
VALUES (%(id)s, %(changed)s, %(sample_ids)s::bigint[])
"""

AUDIT_LIST = f"""{_AUDIT_ENTRIES}
WHERE %(since)s::float8 IS NULL OR a.at >= {_NOW} - make_interval(secs => %(since)s::float8)
ORDER BY a.at, a.id
"""

AUDIT_PRUNE = f"""
DELETE FROM job_audit WHERE at < {_NOW} - make_interval(secs => %(older_than)s)
"""
