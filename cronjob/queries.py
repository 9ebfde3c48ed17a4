"""Every SQL statement jobrunner runs but the migration files, named entity-verb-qualifier.

Each is executed by the store function of the same name (cronjob.store).

Time-dependent statements take an optional `now` parameter so tests can drive the
clock; in production it is NULL and the database clock decides.
"""

from __future__ import annotations

_NOW = "coalesce(%(now)s::timestamptz, now())"
# For statements that may run late in a longer transaction (a success recorded in
# the handler's own ctx.db transaction): now() would be when that transaction began.
_STATEMENT_NOW = "coalesce(%(now)s::timestamptz, statement_timestamp())"

_RUN_COLUMNS = (
    "id, definition_id, job_type, payload::text AS payload, tenant_id, scheduled_for, run_at,"
    " status, attempts, max_attempts, priority, idempotency_key, locked_by, locked_until,"
    " last_error, error_type, started_at, finished_at, created_at, updated_at"
)


# Ids are drawn from the sequence up front so each input row can be matched to
# the id it got, whether it was inserted now or already existed under its key.
# The arrays travel in binary: text arrays of JSON would otherwise be quoted and
# escaped element by element.
def _runs_insert_many(queue: bool) -> str:
    return f"""
WITH input AS (
    SELECT nextval('job_runs_id_seq') AS new_id, i.*
    FROM unnest(
        %(job_types)b::text[], %(payloads)b::text[], %(run_ats)b::timestamptz[],
        %(delays)b::float8[], %(keys)b::text[], %(max_attempts)b::int[],
        %(priorities)b::int[], %(tenants)b::text[]{", %(queues)b::text[]" if queue else ""}
    ) WITH ORDINALITY AS i(job_type, payload, run_at, delay, idempotency_key, max_attempts,
                           priority, tenant_id{", queue" if queue else ""}, ord)
),
inserted AS (
    INSERT INTO job_runs (id, job_type, payload, run_at, idempotency_key, max_attempts,
                          priority, tenant_id{", queue" if queue else ""}, created_at, updated_at)
    SELECT new_id, job_type, payload::jsonb,
           coalesce(run_at, {_NOW} + make_interval(secs => coalesce(delay, 0))),
           idempotency_key, max_attempts, coalesce(priority, 0), tenant_id,
           {"queue, " if queue else ""}{_NOW}, {_NOW}
    FROM input ORDER BY ord
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, idempotency_key, job_type, tenant_id
)
SELECT i.ord, i.idempotency_key,
       coalesce(mine.id, same_key.id, existing.id) AS id,
       mine.id IS NOT NULL AS created,
       CASE WHEN mine.id IS NOT NULL THEN i.job_type
            WHEN same_key.id IS NOT NULL THEN same_key.job_type
            ELSE existing.job_type END AS job_type,
       CASE WHEN mine.id IS NOT NULL THEN i.tenant_id
            WHEN same_key.id IS NOT NULL THEN same_key.tenant_id
            ELSE existing.tenant_id END AS tenant_id
FROM input i
LEFT JOIN inserted mine ON mine.id = i.new_id
LEFT JOIN inserted same_key ON mine.id IS NULL AND same_key.idempotency_key = i.idempotency_key
LEFT JOIN job_runs existing ON mine.id IS NULL AND same_key.id IS NULL
                           AND existing.idempotency_key = i.idempotency_key
ORDER BY i.ord
"""


# Runs enqueued any way but through Django's Tasks backend name no queue, so that code
# upgraded before `jobrunner migrate` added the column (0014) can still enqueue them.
RUNS_INSERT_MANY = _runs_insert_many(queue=False)
RUNS_INSERT_MANY_QUEUED = _runs_insert_many(queue=True)

RUNS_INSERT_MANY_IDS_BY_KEY = (
    "SELECT idempotency_key, id, job_type, tenant_id FROM job_runs"
    " WHERE idempotency_key = ANY(%(keys)s)"
)

# Batches that carry idempotency keys take turns: two batches holding some of each
# other's keys, in different orders, would otherwise wait on each other until the
# server broke the deadlock by failing one. This constant spells "jobkeys".
RUNS_LOCK_FOR_KEYED_BATCH = "SELECT pg_advisory_xact_lock(29958816149218675)"
RUNS_LOCK_FOR_KEYED_BATCH_TRY = "SELECT pg_try_advisory_xact_lock(29958816149218675)"


def _claimable(job_types: str) -> str:
    """The tick's job types less the paused ones (job_type_pauses), as an array.

    An uncorrelated subquery: PostgreSQL evaluates it once per statement, and the
    claim's scan then compares each row against the shorter array, as it did before.
    """
    return (
        f"ARRAY(SELECT t FROM unnest({job_types}::text[]) AS t"
        " WHERE NOT EXISTS (SELECT 1 FROM job_type_pauses p WHERE p.job_type = t))"
    )


# One question before a tick sets anything up: is there a due run of a type this
# tick handles, a lease to rescue, or a schedule to materialize? Most ticks on most
# hosts find nothing, and then cost this one round trip.
TICK_WORK_EXISTS = f"""
SELECT EXISTS (SELECT 1 FROM job_runs
               WHERE status IN ('queued', 'failed') AND run_at <= {_NOW}
                 AND job_type = ANY({_claimable("%(job_types)s")}))
    OR EXISTS (SELECT 1 FROM job_runs WHERE status = 'running' AND locked_until < {_NOW})
    OR EXISTS (SELECT 1 FROM job_definitions WHERE enabled AND next_fire_at <= {_NOW})
"""

# The one rule for failed or dead: an attempt that used up its run's budget is the
# final one. The claim hands its verdict to the runner's decision
# (ClaimedRun.final_attempt, read by transitions.decide) and rescue applies it to
# the runs it recovers, so the two can never disagree. Columns are unqualified:
# both statements read them from the only relation that has them.
_FINAL_ATTEMPT = "attempts >= coalesce(max_attempts, 1)"

# The claim must walk job_runs_dispatch in order and stop after `limit` rows. With
# statistics that predate a burst of enqueues (or none yet, on a fresh table) the
# planner expects few runnable rows and prefers a bitmap scan that sorts every one
# of them, on every claim. Set for the rest of the claim's own transaction, of which
# the claim is the last statement.
RUNS_CLAIM_MANY_PLAN = (
    "SELECT set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true)"
)

# What a claim returns, read by position into models.ClaimedRun on the tick's hot path
# (store._claimed_runs): ClaimedRun's fields in order, each under its field's name, bar
# the lease token, which is the caller's own parameter. The payload comes as text for
# store's one JSON decoder. tests/test_layout.py fails if the two part ways.
RUNS_CLAIM_MANY_COLUMNS = (
    "id, job_type, payload::text AS payload, tenant_id, scheduled_for, attempts AS attempt,"
    f" {_FINAL_ATTEMPT} AS final_attempt, definition_id"
)

# A run of a schedule whose overlap policy is 'skip' or 'queue' (migration 0011) starts only
# when nothing else of its schedule and tenant is running and it is the oldest one waiting.
# So at most one such run is ever claimable per schedule and tenant: two ticks racing for it
# meet on its row lock, and a tick whose snapshot predates another's claim still sees that
# older run waiting. A running run whose lease expired blocks the others until it is rescued
# and done. Other runs pay only the `NOT exclusive` test.
_EXCLUSIVE_RUN_IS_NEXT = """NOT EXISTS (
        SELECT 1 FROM job_runs o
        WHERE o.exclusive AND o.definition_id = job_runs.definition_id
          AND coalesce(o.tenant_id, '') = coalesce(job_runs.tenant_id, '')
          AND o.status IN ('queued', 'running', 'failed') AND o.id <> job_runs.id
          AND (o.status = 'running' OR o.id < job_runs.id))"""

# The locking subquery is a MATERIALIZED CTE: as `WHERE id IN (SELECT ... LIMIT n)`
# the planner may re-run it and claim more than n rows. The update finds its rows
# through `id = ANY(array)`, a primary-key lookup whatever the table's size, and
# takes each type's lease and attempt budget by position in the parallel arrays.
# One lease token covers the whole claim: ids tell its runs apart, and a fresh
# uuid per row would be a third of the statement's cost.
RUNS_CLAIM_MANY = f"""
WITH c AS MATERIALIZED (
    SELECT id FROM job_runs
    WHERE status IN ('queued', 'failed') AND run_at <= {_NOW}
      AND job_type = ANY({_claimable("%(job_types)b")})
      AND (NOT exclusive OR {_EXCLUSIVE_RUN_IS_NEXT})
    ORDER BY priority, run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
claimed AS (
    UPDATE job_runs r
    SET status = 'running',
        attempts = r.attempts + 1,
        max_attempts = coalesce(
            r.max_attempts,
            (%(max_attempts)b::int[])[array_position(%(job_types)b::text[], r.job_type)]),
        locked_by = %(worker)s,
        locked_until = {_NOW} + make_interval(
            secs => (%(leases)b::float8[])[array_position(%(job_types)b::text[], r.job_type)]),
        lease_token = %(token)s,
        started_at = {_NOW},
        updated_at = {_NOW}
    WHERE r.id = ANY(ARRAY(SELECT id FROM c))
    RETURNING r.id, r.job_type, r.payload, r.tenant_id, r.scheduled_for, r.attempts,
              r.definition_id,
              r.max_attempts, r.priority, r.run_at
)
-- Handed to the workers in this order, so a batch starts in priority order too.
SELECT {RUNS_CLAIM_MANY_COLUMNS}
FROM claimed ORDER BY priority, run_at, id
"""

# One guarded write for a batch of mixed outcomes: a row changes only while its
# caller still holds the lease token, so a worker that lost its lease (stalled,
# cancelled, re-claimed) can never overwrite a newer outcome. Failed attempts are
# recorded in the same statement. `id = ANY(ids)` (here and in the statements
# below) keeps the lookup on the primary key however many rows the table holds.
RUNS_FINALIZE_MANY = f"""
WITH o AS (
    SELECT * FROM unnest(
        %(ids)b::bigint[], %(tokens)b::uuid[], %(statuses)b::text[], %(delays)b::float8[],
        %(error_types)b::text[], %(messages)b::text[], %(tracebacks)b::text[]
    ) AS o(id, lease_token, status, delay, error_type, message, traceback)
),
done AS (
    UPDATE job_runs r
    SET status = o.status,
        run_at = CASE WHEN o.status = 'failed'
                      THEN {_STATEMENT_NOW} + make_interval(secs => o.delay) ELSE r.run_at END,
        finished_at = CASE WHEN o.status IN ('succeeded', 'dead') THEN {_STATEMENT_NOW} END,
        last_error = coalesce(o.message, r.last_error),
        error_type = coalesce(o.error_type, r.error_type),
        finished_by = CASE WHEN o.status IN ('succeeded', 'dead') THEN r.locked_by END,
        locked_by = NULL, locked_until = NULL, lease_token = NULL,
        updated_at = {_STATEMENT_NOW}
    FROM o
    WHERE r.id = ANY(%(ids)b::bigint[])
      AND r.id = o.id AND r.lease_token = o.lease_token AND r.status = 'running'
    RETURNING r.id, r.attempts, r.started_at, o.status,
              o.error_type, o.message, o.traceback
),
history AS (
    INSERT INTO job_attempts (run_id, attempt, worker, error_type, message, traceback,
                              started_at, finished_at)
    SELECT id, attempts, %(worker)s, error_type, message, traceback, started_at, {_STATEMENT_NOW}
    FROM done WHERE status IN ('failed', 'dead')
)
SELECT id FROM done
"""

# Renew every lease this tick holds in one statement; runs missing from the
# result were cancelled or re-claimed, and their handlers must be told.
RUNS_HEARTBEAT_MANY = f"""
UPDATE job_runs r
SET locked_until = {_NOW} + make_interval(secs => o.lease), updated_at = {_NOW}
FROM unnest(%(ids)b::bigint[], %(tokens)b::uuid[], %(leases)b::float8[])
    AS o(id, lease_token, lease)
WHERE r.id = ANY(%(ids)b::bigint[])
  AND r.id = o.id AND r.lease_token = o.lease_token AND r.status = 'running'
RETURNING r.id, r.locked_until
"""

# Unfinished work goes back as if never claimed: due now, the attempt not counted.
_HAND_BACK = f"""
UPDATE job_runs r
SET status = CASE WHEN r.attempts > 1 THEN 'failed' ELSE 'queued' END,
    attempts = r.attempts - 1,
    run_at = {_NOW},
    locked_by = NULL, locked_until = NULL, lease_token = NULL,
    started_at = NULL,
    updated_at = {_NOW}
"""

RUNS_HAND_BACK_MANY = f"""{_HAND_BACK}
FROM unnest(%(ids)b::bigint[], %(tokens)b::uuid[]) AS o(id, lease_token)
WHERE r.id = ANY(%(ids)b::bigint[])
  AND r.id = o.id AND r.lease_token = o.lease_token AND r.status = 'running'
RETURNING r.id
"""

# Every run one claim still holds, found by the claim's lease token: for a claim whose
# commit took effect but whose answer was lost, so the claimer never learnt its runs.
# Running rows are few, and job_runs_leases indexes exactly them.
RUNS_HAND_BACK_CLAIM = f"""{_HAND_BACK}
WHERE r.status = 'running' AND r.lease_token = %(token)s
RETURNING r.id
"""

# Which decisions a claim whose answer was lost wrote with it: each run still as its decision
# left it, in the attempt the claim held. Later changes show in the attempt number, the
# status, or who finished it: a rescue records no finisher and its own error type, a retry
# or a cancel another status.
RUNS_LIST_DECIDED = """
SELECT r.id
FROM job_runs r
JOIN unnest(%(ids)b::bigint[], %(attempts)b::int[], %(statuses)b::text[],
            %(error_types)b::text[]) AS d(id, attempt, status, error_type) ON d.id = r.id
WHERE r.id = ANY(%(ids)b::bigint[])
  AND r.attempts = d.attempt AND r.status = d.status AND r.lease_token IS NULL
  AND CASE WHEN d.status = 'failed' THEN r.error_type = d.error_type
           ELSE r.finished_by = %(worker)s END
"""

# Crash recovery: a running run whose lease expired lost its worker. The lost
# attempt is recorded, and the run is due again or, out of attempts, dead.
RUNS_RESCUE_MANY = f"""
WITH expired AS (
    SELECT id, locked_by FROM job_runs
    WHERE status = 'running' AND locked_until < {_NOW}
    ORDER BY locked_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
rescued AS (
    UPDATE job_runs r
    SET status = CASE WHEN {_FINAL_ATTEMPT} THEN 'dead' ELSE 'failed' END,
        run_at = {_NOW},
        finished_at = CASE WHEN {_FINAL_ATTEMPT} THEN {_NOW} END,
        last_error = 'lease expired: the worker ' || coalesce(r.locked_by, '?')
                     || ' stopped heartbeating (crashed, killed or stalled)',
        error_type = 'lease_expired',
        locked_by = NULL, locked_until = NULL, lease_token = NULL,
        updated_at = {_NOW}
    FROM expired e
    WHERE r.id = e.id
    RETURNING r.id, r.attempts, e.locked_by, r.started_at, r.last_error, r.status
)
INSERT INTO job_attempts (run_id, attempt, worker, error_type, message, started_at, finished_at)
SELECT id, attempts, locked_by, 'lease_expired', last_error, started_at, {_NOW} FROM rescued
RETURNING run_id
"""

RUN_GET = f"SELECT {_RUN_COLUMNS} FROM job_runs WHERE id = %(id)s"

RUNS_LIST_IDS_BY_DEFINITION = (
    "SELECT id FROM job_runs WHERE definition_id = ANY(%(definition_ids)s) ORDER BY id"
)

RUN_ATTEMPTS_GET = """
SELECT attempt, worker, error_type, message, traceback, started_at, finished_at
FROM job_attempts WHERE run_id = %(id)s ORDER BY attempt, id
"""

# retry: due now, lock cleared; dead and cancelled runs get a fresh attempt budget.
# What retry and cancel do to a run (`t` is its row as locked before the change), whether
# it was named by id or picked by a selection: the same change either way.
_RETRY_SET = f"""
    SET status = CASE WHEN t.status IN ('dead', 'cancelled') OR r.attempts = 0
                      THEN 'queued' ELSE 'failed' END,
        attempts = CASE WHEN t.status IN ('dead', 'cancelled') THEN 0 ELSE r.attempts END,
        run_at = {_NOW},
        finished_at = NULL,
        locked_by = NULL, locked_until = NULL, lease_token = NULL,
        updated_at = {_NOW}
"""
_CANCEL_SET = f"""
    SET status = 'cancelled', finished_at = {_NOW},
        locked_by = NULL, locked_until = NULL, lease_token = NULL,
        updated_at = {_NOW}
"""

RUNS_RETRY_MANY = f"""
WITH target AS (
    SELECT id, status FROM job_runs WHERE id = ANY(%(ids)s) ORDER BY id FOR UPDATE
),
changed AS (
    UPDATE job_runs r {_RETRY_SET}
    FROM target t
    WHERE r.id = t.id AND t.status <> 'succeeded'
    RETURNING r.id
)
SELECT t.id, t.status, c.id IS NOT NULL AS changed
FROM target t LEFT JOIN changed c USING (id)
"""

RUNS_CANCEL_MANY = f"""
WITH target AS (
    SELECT id, status FROM job_runs WHERE id = ANY(%(ids)s) ORDER BY id FOR UPDATE
),
changed AS (
    UPDATE job_runs r {_CANCEL_SET}
    FROM target t
    WHERE r.id = t.id AND t.status IN ('queued', 'failed', 'running')
    RETURNING r.id
)
SELECT t.id, t.status, c.id IS NOT NULL AS changed
FROM target t LEFT JOIN changed c USING (id)
"""

_RUNS_LIST_FILTER = """
WHERE (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s))
  AND (%(job_types)s::text[] IS NULL OR job_type = ANY(%(job_types)s))
ORDER BY id DESC
LIMIT %(limit)s
"""
RUNS_LIST = f"SELECT {_RUN_COLUMNS} FROM job_runs {_RUNS_LIST_FILTER}"

# The table `list` prints shows no payload, and a thousand payloads of a megabyte each
# are a gigabyte to fetch and decode for nothing.
_RUN_COLUMNS_WITHOUT_PAYLOAD = _RUN_COLUMNS.replace(
    " payload::text AS payload,", " 'null' AS payload,"
)
RUNS_LIST_WITHOUT_PAYLOAD = (
    f"SELECT {_RUN_COLUMNS_WITHOUT_PAYLOAD} FROM job_runs {_RUNS_LIST_FILTER}"
)

# -- effects: the handler's transaction and the effects ledger --

# Marks ctx.db's transaction as the one opened for this claim. The setting is
# transaction-local, so it is gone if the handler commits or rolls back itself;
# the runner checks it before recording success in that transaction.
HANDLER_TRANSACTION_MARK = "SELECT set_config('jobrunner.lease_token', %(token)s, true)"

HANDLER_TRANSACTION_GET_MARK = "SELECT current_setting('jobrunner.lease_token', true)"

# The handler may have raised its own limits with SET (LOCAL); the runner's
# statements in that transaction wait no longer than the runner's own do.
HANDLER_TRANSACTION_RESTORE_LIMITS = (
    "SET LOCAL statement_timeout TO DEFAULT; SET LOCAL lock_timeout TO DEFAULT"
)

# Exactly once: inside ctx.db, so the key commits with the run's success or not
# at all. A key inserted by a concurrent, still open transaction makes this wait
# for it: False if that run succeeds, True if it rolls back.
EFFECT_INSERT_ONCE = """
INSERT INTO job_effects (key, run_id, attempt, kind)
VALUES (%(key)s, %(run_id)s, %(attempt)s, 'once')
ON CONFLICT (key) DO NOTHING
RETURNING 1
"""

# At most once: committed on its own before the effect, and only while the run
# still holds its lease, so a worker that lost its run starts nothing new.
EFFECT_INSERT_AT_MOST_ONCE = """
WITH held AS (
    SELECT id, attempts FROM job_runs
    WHERE id = %(run_id)s AND lease_token = %(token)s AND status = 'running'
),
recorded AS (
    INSERT INTO job_effects (key, run_id, attempt, kind)
    SELECT %(key)s, id, attempts, 'at_most_once' FROM held
    ON CONFLICT (key) DO NOTHING
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM held), EXISTS (SELECT 1 FROM recorded)
"""

# Retention: a key goes once its run is gone (pruned) and it is older than the
# retention. A key whose run still exists is kept whatever its age: that run may
# still be retried, and forgetting the key would repeat the effect.
EFFECTS_PRUNE_MANY = f"""
WITH doomed AS (
    SELECT e.key FROM job_effects e
    WHERE e.created_at < {_NOW} - make_interval(secs => %(older_than)s)
      AND NOT EXISTS (SELECT 1 FROM job_runs r WHERE r.id = e.run_id)
    ORDER BY e.created_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM job_effects e USING doomed d
WHERE e.key = d.key
"""


# -- operations --

# Everything `status`, `metrics` and `check` need about runs: one row per (job type,
# status) with the counts and ages that matter. Runs that can still execute are read
# through the partial indexes over runnable and running rows; finished runs are never
# read, only their tally (migration 0010), so the cost follows the active queue and not
# the history kept. The clock row is joined on so an empty table still tells the time.
RUNS_SNAPSHOT = f"""
WITH clock AS (SELECT {_NOW} AS now),
runnable AS (
    SELECT r.job_type, r.status, count(*) AS runs,
           count(*) FILTER (WHERE r.run_at <= c.now) AS due,
           0::bigint AS expired_leases,
           min(r.run_at) FILTER (WHERE r.run_at <= c.now) AS oldest_due_at,
           max(r.started_at) AS last_started_at
    FROM job_runs r CROSS JOIN clock c
    WHERE r.status IN ('queued', 'failed')
    GROUP BY r.job_type, r.status
),
running AS (
    SELECT r.job_type, r.status, count(*) AS runs, 0::bigint AS due,
           count(*) FILTER (WHERE r.locked_until < c.now) AS expired_leases,
           NULL::timestamptz AS oldest_due_at, max(r.started_at) AS last_started_at
    FROM job_runs r CROSS JOIN clock c
    WHERE r.status = 'running'
    GROUP BY r.job_type, r.status
),
finished AS (
    SELECT job_type, status, sum(runs)::bigint AS runs, 0::bigint AS due,
           0::bigint AS expired_leases, NULL::timestamptz AS oldest_due_at,
           max(last_started_at) AS last_started_at
    FROM job_run_tally
    GROUP BY job_type, status
    HAVING sum(runs) <> 0
),
cells AS (
    SELECT * FROM runnable UNION ALL SELECT * FROM running UNION ALL SELECT * FROM finished
)
SELECT clock.now, cells.job_type, cells.status, cells.runs, cells.due, cells.expired_leases,
       cells.oldest_due_at, cells.last_started_at
FROM clock LEFT JOIN cells ON true
ORDER BY cells.job_type, cells.status
"""

# The runnable rows are read through job_runs_dispatch, whose order (priority, run_at, id)
# is not the table's: a plain index scan visits a heap page per row, where a bitmap scan
# reads each page once. Set for the snapshot's own transaction, of which it is the last
# statement.
RUNS_SNAPSHOT_PLAN = "SELECT set_config('enable_indexscan', 'off', true)"

# Folds the tally's deltas into one row per (job type, status), at the end of a tick
# that did work. One tick at a time (others skip, not wait); deltas committed meanwhile
# are not seen by the DELETE and stay for the next fold.
RUN_TALLY_COMPACT = """
WITH folding AS (SELECT pg_try_advisory_xact_lock(7669456938163791205) AS mine),
gone AS (
    DELETE FROM job_run_tally WHERE (SELECT mine FROM folding)
    RETURNING job_type, status, runs, last_started_at
)
INSERT INTO job_run_tally (job_type, status, runs, last_started_at)
SELECT job_type, status, sum(runs), max(last_started_at) FROM gone
GROUP BY job_type, status
HAVING sum(runs) <> 0
"""

DEFINITIONS_LIST_SCHEDULES = """
SELECT name, job_type, schedule, timezone, enabled, next_fire_at, overlap, overlap_skips
FROM job_definitions
ORDER BY enabled DESC, next_fire_at NULLS LAST, name
"""

# Run time of runs that finished recently, per job type. Cancelled runs are left
# out: their started_at belongs to an attempt that never reported back.
RUNS_SUMMARIZE_DURATIONS = f"""
SELECT job_type, count(*) AS count, sum(seconds) AS total,
       percentile_cont(%(quantiles)s::float8[]) WITHIN GROUP (ORDER BY seconds) AS seconds
FROM (
    SELECT job_type, extract(epoch FROM finished_at - started_at)::float8 AS seconds
    FROM job_runs
    WHERE finished_at >= {_NOW} - make_interval(secs => %(window)s)
      AND status IN ('succeeded', 'dead') AND started_at IS NOT NULL
) recent
GROUP BY job_type
ORDER BY job_type
"""

# One batch of pruning, committed on its own so no lock is held for long. The
# terminal statuses are spelled out again here: whatever the caller passes, a
# run that may still execute is never deleted. Attempts go with their run
# (ON DELETE CASCADE).
RUNS_PRUNE_BATCH = f"""
WITH batch AS MATERIALIZED (
    SELECT id FROM job_runs
    WHERE status IN ('succeeded', 'dead', 'cancelled') AND status = ANY(%(statuses)s)
      AND finished_at < {_NOW} - make_interval(secs => %(older_than)s)
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
gone AS (
    DELETE FROM job_runs r USING batch b WHERE r.id = b.id RETURNING r.status
)
SELECT status, count(*) FROM gone GROUP BY status
"""

# -- incidents: acting on sets of runs, paused job types, the audit trail --

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


def _batch(change: str) -> str:
    """One batch of a selection: the next `limit` rows after id `after`, locked, changed.

    Walking by id, each batch resumes where the last stopped, so the whole command reads
    the table once. Locks are held for one batch, its own transaction. A row that
    changed while the batch waited for its lock is checked again against the selection
    (FOR UPDATE re-reads it), and LIMIT counts only the rows that pass.
    """
    return f"""
WITH target AS MATERIALIZED (
    SELECT id, status FROM job_runs
    WHERE {_SELECTED} AND id > %(after)s
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE
),
changed AS (
{change}
)
SELECT (SELECT max(id) FROM target) AS last_id,
       coalesce(array_agg(id ORDER BY id), '{{}}') AS ids,
       coalesce(array_agg(status ORDER BY id), '{{}}') AS statuses
FROM changed
"""


# As RUNS_RETRY_MANY, for a batch of a selection.
RUNS_RETRY_SELECTED = _batch(f"""
    UPDATE job_runs r {_RETRY_SET}
    FROM target t
    WHERE r.id = t.id
    RETURNING r.id, t.status
""")

# As RUNS_CANCEL_MANY: a running run's handler learns it at its next heartbeat.
RUNS_CANCEL_SELECTED = _batch(f"""
    UPDATE job_runs r {_CANCEL_SET}
    FROM target t
    WHERE r.id = t.id
    RETURNING r.id, t.status
""")

# Attempts go with their run (ON DELETE CASCADE).
RUNS_PRUNE_SELECTED = _batch("""
    DELETE FROM job_runs r USING target t
    WHERE r.id = t.id
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

AUDIT_INSERT = f"""
INSERT INTO job_audit (at, actor, command, selection, changed, sample_ids, reason)
VALUES ({_NOW}, %(actor)s, %(command)s, %(selection)s::jsonb, %(changed)s,
        %(sample_ids)s::bigint[], %(reason)s)
RETURNING id
"""

# A later batch of the same command: its count and sample grow in that batch's commit.
AUDIT_ADD_CHANGED = """
UPDATE job_audit
SET changed = changed + %(changed)s,
    sample_ids = (sample_ids || %(sample_ids)s::bigint[])[1:%(sample)s]
WHERE id = %(id)s
"""

AUDIT_LIST = f"""
SELECT id, at, actor, command, selection, changed, sample_ids, reason FROM job_audit
WHERE %(since)s::float8 IS NULL OR at >= {_NOW} - make_interval(secs => %(since)s::float8)
ORDER BY at, id
"""

AUDIT_PRUNE = f"""
DELETE FROM job_audit WHERE at < {_NOW} - make_interval(secs => %(older_than)s)
"""


# -- schedules --

CLOCK_NOW = f"SELECT {_NOW}"

_DEFINITION_COLUMNS = (
    "id, name, job_type, payload, schedule, timezone, scope, max_attempts, priority, catch_up,"
    " catch_up_limit, overlap, overlap_skips, expect_within, ping_url, ping_failure_url,"
    " enabled, materialized_through, next_fire_at, created_at, updated_at"
)

# A definition starts from the moment it is created: its high-water mark is that moment, so
# nothing before it is ever materialized.
DEFINITION_INSERT = f"""
INSERT INTO job_definitions (name, job_type, payload, schedule, timezone, scope, max_attempts,
                             priority, catch_up, catch_up_limit, overlap, expect_within,
                             ping_url, ping_failure_url, enabled, materialized_through,
                             next_fire_at, created_at, updated_at)
VALUES (%(name)s, %(job_type)s, %(payload)s::jsonb, %(schedule)s, %(timezone)s, %(scope)s,
        %(max_attempts)s, %(priority)s, %(catch_up)s, %(catch_up_limit)s, %(overlap)s,
        %(expect_within)s, %(ping_url)s, %(ping_failure_url)s, %(enabled)s, %(now)s,
        %(next_fire_at)s, %(now)s, %(now)s)
ON CONFLICT (name) DO NOTHING
RETURNING {_DEFINITION_COLUMNS}
"""

DEFINITION_UPDATE = f"""
UPDATE job_definitions
SET job_type = %(job_type)s, payload = %(payload)s::jsonb, schedule = %(schedule)s,
    timezone = %(timezone)s, scope = %(scope)s, max_attempts = %(max_attempts)s,
    priority = %(priority)s, catch_up = %(catch_up)s, catch_up_limit = %(catch_up_limit)s,
    overlap = %(overlap)s, expect_within = %(expect_within)s, ping_url = %(ping_url)s,
    ping_failure_url = %(ping_failure_url)s, enabled = %(enabled)s,
    materialized_through = %(materialized_through)s,
    next_fire_at = %(next_fire_at)s, updated_at = %(now)s
WHERE id = %(id)s
RETURNING {_DEFINITION_COLUMNS}
"""

# Pausing keeps the mark; resuming moves it to now (computed by the caller).
DEFINITION_SET_ENABLED = f"""
UPDATE job_definitions
SET enabled = %(enabled)s, materialized_through = %(materialized_through)s,
    next_fire_at = %(next_fire_at)s, updated_at = %(now)s
WHERE id = %(id)s
RETURNING {_DEFINITION_COLUMNS}
"""

DEFINITION_GET = f"SELECT {_DEFINITION_COLUMNS} FROM job_definitions WHERE name = %(name)s"

# Waits for a tick that is materializing this definition, so a pause or resume never
# interleaves with its high-water mark moving.
DEFINITION_GET_FOR_UPDATE = DEFINITION_GET + " FOR UPDATE"

DEFINITIONS_LIST = f"SELECT {_DEFINITION_COLUMNS} FROM job_definitions ORDER BY name"

DEFINITIONS_LIST_FOR_UPDATE = DEFINITIONS_LIST + " FOR UPDATE"

# Its runs stay, unlinked by a trigger (migration 0006).
DEFINITION_DELETE = "DELETE FROM job_definitions WHERE id = %(id)s"

DEFINITION_RUNS_COUNT_BY_STATUS = """
SELECT status, count(*) FROM job_runs WHERE definition_id = %(id)s GROUP BY status
"""

# The runs of a definition's newest materialized occurrence, by status: for a tenant-scoped
# schedule, how its tenants fared. Both steps walk the occurrence index.
DEFINITION_RUNS_COUNT_LATEST_OCCURRENCE = """
SELECT max(r.scheduled_for) AS scheduled_for, r.status, count(*)
FROM job_runs r
WHERE r.definition_id = %(id)s AND r.scheduled_for = (
    SELECT max(scheduled_for) FROM job_runs WHERE definition_id = %(id)s)
GROUP BY r.status
"""

DEFINITION_RUNS_LIST_RECENT = """
SELECT id, tenant_id, scheduled_for, status, attempts FROM job_runs
WHERE definition_id = %(id)s
ORDER BY scheduled_for DESC, id DESC
LIMIT %(limit)s
"""

# An idle tick's whole cost for schedules: one index probe, and the clock every batch of the
# tick then uses, so all of them agree on what "due" means.
DEFINITIONS_DUE_EXISTS = f"""
SELECT {_NOW}, EXISTS (
    SELECT 1 FROM job_definitions WHERE enabled AND next_fire_at <= {_NOW}
)
"""

# SKIP LOCKED: concurrent ticks split the due definitions between them instead of queueing
# behind each other. A row another tick advanced meanwhile is re-checked against
# `next_fire_at <= now` before it is locked, so it is not taken twice. Ordered by the due
# index alone, so a batch is a short index range scan rather than a sort of everything due.
DEFINITIONS_CLAIM_DUE_MANY = """
SELECT id, name, schedule, timezone, scope, catch_up, catch_up_limit, overlap,
       materialized_through
FROM job_definitions
WHERE enabled AND next_fire_at <= %(now)s AND id <> ALL(%(skip)s::bigint[])
  AND (%(only)s::bigint[] IS NULL OR id = ANY(%(only)s::bigint[]))
ORDER BY next_fire_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""

_OCCURRENCE_CONFLICT = (
    "ON CONFLICT (definition_id, scheduled_for, (coalesce(tenant_id, '')))"
    " WHERE definition_id IS NOT NULL DO NOTHING"
)

# Global runs of a whole batch and the definitions' new high-water marks, in one statement:
# the mark moves in the same transaction as the runs appear, so pruning runs later can never
# make a tick create them again. The unique occurrence index settles any race that got past
# the row locks. The arrays travel in binary: as text, each timestamp is formatted and quoted,
# which for a batch of a thousand definitions took longer than the statement itself.
RUNS_MATERIALIZE_MANY = f"""
WITH occurrence AS (
    SELECT * FROM unnest(%(run_definition_ids)b::bigint[], %(scheduled_fors)b::timestamptz[])
        AS o(definition_id, scheduled_for)
),
created AS (
    INSERT INTO job_runs (definition_id, job_type, payload, scheduled_for, run_at, max_attempts,
                          priority, created_at, updated_at)
    SELECT d.id, d.job_type, d.payload, o.scheduled_for, o.scheduled_for, d.max_attempts,
           d.priority, %(now)s, %(now)s
    FROM occurrence o JOIN job_definitions d ON d.id = o.definition_id
    {_OCCURRENCE_CONFLICT}
    RETURNING 1
),
advanced AS (
    UPDATE job_definitions d
    SET materialized_through = greatest(d.materialized_through, a.materialized_through),
        next_fire_at = a.next_fire_at
    FROM unnest(%(ids)b::bigint[], %(throughs)b::timestamptz[], %(next_fire_ats)b::timestamptz[])
        AS a(id, materialized_through, next_fire_at)
    WHERE d.id = a.id
    RETURNING 1
)
SELECT (SELECT count(*) FROM created), (SELECT count(*) FROM advanced)
"""

# One tenant-scoped definition: a run per tenant and occurrence, in one INSERT ... SELECT.
# The operator's tenant query is embedded as a subquery (a FROM item admits a query and
# nothing else); its first column, whatever it is called, is the tenant id (NULL and empty
# ids are no tenants). Sorted, so the rows reach the occurrence index in key order.
_RUNS_MATERIALIZE_TENANTS = """
INSERT INTO job_runs (definition_id, job_type, payload, tenant_id, scheduled_for, run_at,
                      max_attempts, priority, created_at, updated_at)
SELECT d.id, d.job_type, d.payload, t.tenant_id, o.scheduled_for, o.scheduled_for,
       d.max_attempts, d.priority, %(now)s, %(now)s
FROM job_definitions d
CROSS JOIN unnest(%(scheduled_fors)s::timestamptz[]) AS o(scheduled_for)
CROSS JOIN (
    SELECT DISTINCT jobrunner_tenant_id::text AS tenant_id
    FROM (
{tenants_sql}
    ) AS jobrunner_tenants(jobrunner_tenant_id)
    WHERE jobrunner_tenant_id IS NOT NULL AND jobrunner_tenant_id::text <> ''
    ORDER BY 1
) AS t
WHERE d.id = %(id)s
"""

RUNS_MATERIALIZE_TENANTS = _RUNS_MATERIALIZE_TENANTS + _OCCURRENCE_CONFLICT

# When none of these occurrences has a run yet, which the caller checks while holding the
# definition's row lock (no other tick can add one meanwhile), a plain INSERT does: it skips
# the speculative insertion ON CONFLICT performs for every row, about a third of the cost
# of a fan-out over 100,000 tenants. The occurrence index still refuses any duplicate.
RUNS_MATERIALIZE_TENANTS_FIRST = _RUNS_MATERIALIZE_TENANTS

RUNS_MATERIALIZE_TENANTS_OCCURRENCES_EXIST = """
SELECT EXISTS (
    SELECT 1 FROM job_runs
    WHERE definition_id = %(id)s AND scheduled_for = ANY(%(scheduled_fors)s::timestamptz[])
)
"""

# One definition under overlap policy 'skip' or 'queue', global or fanned out over tenants:
# `{keys_sql}` yields the tenant ids (one NULL for a global definition). Each key has room
# for `capacity` unfinished runs (1 under 'skip', 2 under 'queue': one running, one waiting)
# less those it has; its oldest occurrences take the room, the rest are recorded as skipped
# with `reason` (the newest `keep` of them are kept) and counted on the definition. The
# caller holds the definition's row lock, so no other tick adds a run of it meanwhile;
# claims only ever finish runs.
RUNS_MATERIALIZE_EXCLUSIVE = f"""
WITH occurrence AS (
    SELECT o.scheduled_for, o.k
    FROM unnest(%(scheduled_fors)s::timestamptz[]) WITH ORDINALITY AS o(scheduled_for, k)
),
room AS (
    SELECT k.tenant_id, %(capacity)s - (
        SELECT count(*) FROM job_runs r
        WHERE r.exclusive AND r.definition_id = %(id)s
          AND coalesce(r.tenant_id, '') = coalesce(k.tenant_id, '')
          AND r.status IN ('queued', 'running', 'failed')
    ) AS free
    FROM ({{keys_sql}}) AS k(tenant_id)
),
decided AS (
    SELECT room.tenant_id, o.scheduled_for, o.k <= room.free AS runs
    FROM room CROSS JOIN occurrence o
),
created AS (
    INSERT INTO job_runs (definition_id, job_type, payload, tenant_id, scheduled_for, run_at,
                          max_attempts, priority, exclusive, created_at, updated_at)
    SELECT d.id, d.job_type, d.payload, x.tenant_id, x.scheduled_for, x.scheduled_for,
           d.max_attempts, d.priority, true, %(now)s, %(now)s
    FROM decided x JOIN job_definitions d ON d.id = %(id)s
    WHERE x.runs
    ORDER BY x.tenant_id, x.scheduled_for
    {_OCCURRENCE_CONFLICT}
    RETURNING 1
),
skipped AS (
    INSERT INTO job_schedule_skips (definition_id, tenant_id, scheduled_for, reason, created_at)
    SELECT %(id)s, x.tenant_id, x.scheduled_for, %(reason)s, %(now)s
    FROM decided x WHERE NOT x.runs
    RETURNING 1
),
-- The recent skips are kept, not every one: a schedule skipping every minute for a year
-- must not grow a table nobody reads past its first page.
trimmed AS (
    DELETE FROM job_schedule_skips
    WHERE definition_id = %(id)s AND EXISTS (SELECT 1 FROM skipped) AND id <= (
        SELECT id FROM job_schedule_skips WHERE definition_id = %(id)s
        ORDER BY id DESC OFFSET %(keep)s LIMIT 1)
    RETURNING 1
),
counted AS (
    UPDATE job_definitions SET overlap_skips = overlap_skips + (SELECT count(*) FROM skipped)
    WHERE id = %(id)s AND EXISTS (SELECT 1 FROM skipped)
    RETURNING 1
)
SELECT (SELECT count(*) FROM created), (SELECT count(*) FROM skipped),
       (SELECT count(*) FROM counted), (SELECT count(*) FROM trimmed)
"""

# The keys of RUNS_MATERIALIZE_EXCLUSIVE: one global key, or the operator's tenant query read
# as RUNS_MATERIALIZE_TENANTS reads it.
RUNS_MATERIALIZE_EXCLUSIVE_GLOBAL_KEYS = "SELECT NULL::text FROM (VALUES (1)) AS global_key"
RUNS_MATERIALIZE_EXCLUSIVE_TENANT_KEYS = """
    SELECT DISTINCT jobrunner_tenant_id::text
    FROM (
{tenants_sql}
    ) AS jobrunner_tenants(jobrunner_tenant_id)
    WHERE jobrunner_tenant_id IS NOT NULL AND jobrunner_tenant_id::text <> ''
"""

# Definitions with their last success and failure (migration 0012): each one's health row
# read by primary key, whatever the history holds. Every definition (status, check,
# metrics), or the one `schedule show` asks about.
_DEFINITION_HEALTH = f"""
SELECT {_NOW} AS now, d.name, d.schedule, d.timezone, d.scope, d.enabled, d.expect_within,
       d.created_at, d.updated_at, h.last_success_at, h.last_success_for, h.last_failure_at,
       h.last_failure_for, h.last_failure_error
FROM job_definitions d LEFT JOIN job_schedule_health h ON h.definition_id = d.id
"""
DEFINITIONS_LIST_HEALTH = _DEFINITION_HEALTH + "ORDER BY d.name\n"
DEFINITION_GET_HEALTH = _DEFINITION_HEALTH + "WHERE d.id = %(id)s\n"

# Asked once by a busy tick: the schedules whose runs check in (index job_definitions_pinging).
DEFINITIONS_LIST_PING_TARGETS = """
SELECT id AS definition_id, name, ping_url,
       coalesce(ping_failure_url, rtrim(ping_url, '/') || '/fail') AS ping_failure_url
FROM job_definitions WHERE ping_url IS NOT NULL
"""

DEFINITION_SKIPS_LIST_RECENT = """
SELECT tenant_id, scheduled_for, reason, created_at FROM job_schedule_skips
WHERE definition_id = %(id)s
ORDER BY id DESC
LIMIT %(limit)s
"""

# Any constant works; this one spells "jobsched". Two deploys syncing at once apply in turn.
DEFINITIONS_LOCK_FOR_SYNC = "SELECT pg_advisory_xact_lock(7669456938163791204)"
DEFINITIONS_LOCK_FOR_SYNC_TRY = "SELECT pg_try_advisory_xact_lock(7669456938163791204)"


# -- schema: the migrations applied, and applying them --

MIGRATIONS_GET_LATEST_VERSION = "SELECT coalesce(max(version), 0) FROM jobrunner_migrations"

# Transaction-scoped, so it works behind PgBouncer in transaction mode. Any constant
# works; this one spells "jobrunr" (0x6A6F6272756E72) and only has to be unique per
# database.
MIGRATIONS_LOCK = "SELECT pg_advisory_xact_lock(29958816149106290)"
MIGRATIONS_LOCK_TRY = "SELECT pg_try_advisory_xact_lock(29958816149106290)"

# -- waiting for another host: the locks above, and the keyed batch lock of enqueue --

# A host that queues behind another's migration, sync or batch waits for as long as the
# caller allows rather than the runner's 5 s lock_timeout (and 30 s statement_timeout);
# transaction-local, like the locks, and put back once the lock is held.
LOCK_WAIT_LIMITS_SET = """
SELECT set_config('lock_timeout', %(ms)s, true), set_config('statement_timeout', %(ms)s, true)
"""
LOCK_WAIT_LIMITS_RESTORE = (
    "SET LOCAL lock_timeout TO DEFAULT; SET LOCAL statement_timeout TO DEFAULT"
)

MIGRATIONS_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS jobrunner_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now())
"""

MIGRATIONS_LIST_APPLIED = "SELECT version FROM jobrunner_migrations"

MIGRATION_APPLY_RECORD = (
    "INSERT INTO jobrunner_migrations (version, name) VALUES (%(version)s, %(name)s)"
)


# -- Django Tasks (cronjob.django) ------------------------------------------------

# The task types with runs waiting, for a Django tick to import before it claims; with
# `queues` NULL, of every queue. A skip scan of job_runs_waiting_tasks: one index probe per
# (queue, type) pair, however many runs wait.
_WAITING_TASK = "queue IS NOT NULL AND status IN ('queued', 'failed')"
TASK_TYPES_WAITING = f"""
WITH RECURSIVE pairs(queue, job_type) AS (
    (SELECT queue, job_type FROM job_runs WHERE {_WAITING_TASK}
     ORDER BY queue, job_type LIMIT 1)
    UNION ALL
    SELECT next.queue, next.job_type FROM pairs, LATERAL (
        SELECT queue, job_type FROM job_runs
        WHERE {_WAITING_TASK} AND (queue, job_type) > (pairs.queue, pairs.job_type)
        ORDER BY queue, job_type LIMIT 1
    ) next
)
SELECT DISTINCT job_type FROM pairs
WHERE %(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[])
"""

# What the task returned, written in the handler's own transaction (ctx.db), which then
# records the success: fenced by the lease token like the success itself.
TASK_RETURN_VALUE_SET = """
UPDATE job_runs SET return_value = %(value)s::jsonb
WHERE id = %(id)s AND lease_token = %(token)s AND status = 'running'
"""

# One task run as Django's TaskResult shows it, with its failed attempts in order.
TASK_RESULT_GET = """
SELECT r.id, r.job_type, r.payload::text AS payload, r.status, r.priority, r.queue,
       r.run_at, r.created_at, r.started_at, r.finished_at, r.locked_by, r.finished_by,
       r.return_value::text AS return_value,
       coalesce(a.attempts, '[]') AS attempts
FROM job_runs r
LEFT JOIN LATERAL (
    SELECT json_agg(json_build_object(
               'worker', worker, 'error_type', error_type, 'message', message,
               'traceback', traceback, 'started_at', started_at)
           ORDER BY attempt, id) AS attempts
    FROM job_attempts WHERE run_id = r.id
) a ON true
WHERE r.id = %(id)s
"""
