"""A run's life in statements after its enqueue (queries.enqueue): claimed, finalized,
heartbeat, handed back, rescued, read, retried or cancelled by id, pruned; and the marks of
the handler's transaction in which a success is recorded.

Run by cronjob.store.runs. Every write a run's worker makes is behind the lease fence
(`_lease_fence`); everything that ends or interrupts an attempt releases the lease
(`_LEASE_RELEASE`).
"""

from __future__ import annotations

import dataclasses

from cronjob.models import ClaimedRun, Run
from cronjob.queries import (
    _CANCEL_SET,
    _FINAL_ATTEMPT,
    _LEASE_RELEASE,
    _NOW,
    _RETRY_LOCKED,
    _RETRY_SET,
    _RETRY_SUPERSEDED,
    _STATEMENT_NOW,
    _claimable,
    _lease_fence,
)

# A run as shown to users: a column for each field of models.Run, read by name. The
# payload comes as text for store's one JSON decoder.
_RUN_COLUMNS = ", ".join(
    "payload::text AS payload" if field.name == "payload" else field.name
    for field in dataclasses.fields(Run)
)


# The claim must walk job_runs_dispatch in order and stop after `limit` rows. With
# statistics that predate a burst of enqueues (or none yet, on a fresh table) the
# planner expects few runnable rows and prefers a bitmap scan that sorts every one
# of them, on every claim. Set for the rest of the claim's own transaction, of which
# the claim is the last statement. JIT off too: a claim is over in milliseconds, and the
# estimates of its functions' rows can lift its cost past jit_above_cost, when compiling
# the plan would cost a hundred milliseconds, more than the claim itself.
RUNS_CLAIM_MANY_PLAN = (
    "SELECT set_config('enable_bitmapscan', 'off', true),"
    " set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true)"
)

# What a claim returns: models.ClaimedRun's fields in order, each under its field's name,
# bar the lease token, which is the claim's own parameter. Read by position on the tick's
# hot path (store.runs._claimed_runs, which names them beside it). A field that is not
# a column of the same name says here what it is read from: the payload comes as text
# for store's one JSON decoder.
_CLAIMED_AS = {
    "payload": "payload::text",
    "attempt": "attempts",
    "final_attempt": _FINAL_ATTEMPT,
    # Where the tick's next claim of its tenant resumes: only for the runs the fair part
    # took, as the runs of a limited type are chosen apart from the others of their tenant.
    "run_at": "CASE WHEN handed.place > coalesce((SELECT cardinality(ids) FROM limited), 0)"
    " THEN run_at END",
}
_CLAIMED_FIELDS = [name for name in ClaimedRun._fields if name != "lease_token"]
RUNS_CLAIM_MANY_COLUMNS = ", ".join(
    f"{_CLAIMED_AS[name]} AS {name}" if name in _CLAIMED_AS else name for name in _CLAIMED_FIELDS
)
# What the claim's update hands on: the columns of those fields, and what the final
# attempt and the order of the batch are read from.
_CLAIMED_COLUMNS = ", ".join(
    f"r.{name}"
    for name in [
        *(name for name in _CLAIMED_FIELDS if name not in _CLAIMED_AS),
        *("payload", "attempts", "max_attempts", "run_at"),
    ]
)

# A listening tick's claim that carries no outcome (tick/listen.py) does not wait for its commit
# to reach disk (the planner settings above, and this one, in one statement): one lost to a
# crash of the server leaves its runs waiting, to be claimed again, attempt not counted; every
# later commit that waits for its flush (the outcome's) flushes the claim with it.
RUNS_CLAIM_MANY_PLAN_UNFLUSHED = (
    f"{RUNS_CLAIM_MANY_PLAN}, set_config('synchronous_commit', 'off', true)"
)

# -- the claim --
#
# A claim takes the runs of limited types first, each key's room counted under the key's
# lock, and then the others fairly across tenants: within one priority, in turns, so a tenant
# with a backlog of 100,000 runs delays another tenant's due run by no more than its turn.
# Runs without a tenant are one more tenant. Its parts, each a CTE of RUNS_CLAIM_MANY:
#
#   types    the tick's types less the paused and the limited ones
#   limited  the runs of limited types (jobrunner_claimable_limited, migration 0021); skipped
#            by a one-time filter when none of the tick's types has a limit
#   fair     the others, at most what is left of `limit` (jobrunner_claimable_resumed,
#            migration 0022). A full claim (jobrunner_claimable_fair): the (priority, tenant)
#            pairs with waiting runs from the cursor on, one index probe each
#            (jobrunner_tenant_walk), and each tenant's share of its earliest due runs. A claim
#            that resumes: the same over the pairs the tick took runs of since its last full
#            claim, each from after the last run it took (tick/resume.py says why and when)
#   claimed  the update of the runs taken
#
# The runs are handed over in the order the functions give them: by priority, then turn by
# turn, tenant after tenant. A tick passes the last of them as the next claim's cursor, and the
# next claim starts with the tenant after it, so the tenants take turns from claim to claim
# when there are more of them than a batch holds. Everything reads job_runs_dispatch, whose
# keys are (priority, tenant, run_at, id): no step reads a tenant's backlog beyond what it
# takes, and nothing sorts more than a batch's runs. The selection is in functions so that
# their statements are planned once a session: planned with every claim, as one statement,
# they cost a claim of a few runs more than the claim itself.

# The cursor: the last run the previous claim handed over (store.runs; the lowest pair there
# can be for a tick's first claim).
_CURSOR_PRIORITY = "%(cursor_priority)s::int"
_CURSOR_TENANT = "%(cursor_tenant)s::text"
# Where a claim resumes (jobrunner_claimable_resumed, migration 0022): for each (priority,
# tenant) pair the tick took runs of since its last full claim, the last run it took; NULL
# for a full claim (cronjob/tick/resume.py).
_FLOORS = (
    "%(floor_priorities)b::int[], %(floor_tenants)b::text[],"
    " %(floor_run_ats)b::timestamptz[], %(floor_ids)b::bigint[]"
)
_NO_FLOORS = "NULL::int[], NULL::text[], NULL::timestamptz[], NULL::bigint[]"

# A run of a schedule whose overlap policy is 'skip' or 'queue' (migration 0011) starts only
# when nothing else of its schedule and tenant is running and it is the oldest one waiting
# (jobrunner_exclusive_run_is_next, migration 0021, which both functions ask of exclusive
# runs). So at most one such run is ever claimable per schedule and tenant: two ticks racing
# for it meet on its row lock, and a tick whose snapshot predates another's claim still sees
# that older run waiting. A running run whose lease expired blocks the others until it is
# rescued and done. Other runs pay only the `NOT exclusive` test.

_CLAIM_CHOICE = f"""types AS MATERIALIZED (
    SELECT {_claimable("%(job_types)b", limited=False)} AS plain
),
limited AS MATERIALIZED (
    SELECT jobrunner_claimable_limited(
        %(job_types)b::text[], %(limit)s, {_NOW}, {_CURSOR_TENANT}) AS ids
    WHERE EXISTS (SELECT 1 FROM job_type_limits WHERE job_type = ANY(%(job_types)b::text[]))
),
chosen AS MATERIALIZED (
    SELECT coalesce((SELECT ids FROM limited), '{{}}') || jobrunner_claimable_resumed(
        (SELECT plain FROM types), %(limit)s - coalesce((SELECT cardinality(ids) FROM limited), 0),
        {_CURSOR_PRIORITY}, {_CURSOR_TENANT}, {_NOW}, {_FLOORS}) AS ids
)"""

# The runs a claim took: each type's lease and attempt budget by position in the parallel
# arrays. `id = ANY(array)` finds them by primary key whatever the table's size. One lease
# token covers the whole claim: ids tell its runs apart, and a fresh uuid per row would be
# a third of the statement's cost.
#
# Every column the table's constraints tie to the status is set here (finished_at, and the
# lease), whatever the run's row was: the functions lock each run through a snapshot later
# than the statement's, and the update builds its new row from the version the statement
# sees. A run an operator retried in between (cancelled or dead in that version, queued in
# the one locked) gets its row built from the finished version first, and PostgreSQL checks
# the constraints on that row before it moves on to the newer version and builds the row
# again from it. Left as it was, finished_at would fail the whole claim there.
_CLAIM_UPDATE = f"""claimed AS (
    UPDATE job_runs r
    SET status = 'running',
        finished_at = NULL,
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
    WHERE r.id = ANY((SELECT ids FROM chosen)::bigint[])
    RETURNING {_CLAIMED_COLUMNS}
)"""

# The claim's final SELECT (the benchmark's ceiling wraps it: bench/suite/statements.py).
_CLAIM_HAND_OVER = f"""SELECT {RUNS_CLAIM_MANY_COLUMNS}
FROM claimed JOIN unnest((SELECT ids FROM chosen)) WITH ORDINALITY AS handed(id, place) USING (id)
ORDER BY handed.place"""

# The choosing CTEs are MATERIALIZED: the functions lock rows, and must run once.
RUNS_CLAIM_MANY = f"""
WITH {_CLAIM_CHOICE},
{_CLAIM_UPDATE}
-- Handed to the workers in the order chosen: the runs of limited types, then the others by
-- priority, turn by turn.
{_CLAIM_HAND_OVER}
"""

# One guarded write for a batch of mixed outcomes: a row changes only while its
# caller still holds the lease token, so a worker that lost its lease (stalled,
# cancelled, re-claimed) can never overwrite a newer outcome. Failed attempts are
# recorded in the same statement. `id = ANY(ids)` (here and in the statements
# below) keeps the lookup on the primary key however many rows the table holds.
_RUNS_FINALIZE_MANY = f"""
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
        {_LEASE_RELEASE},
        updated_at = {_STATEMENT_NOW}
    FROM o
    WHERE r.id = ANY(%(ids)b::bigint[])
      AND r.id = o.id AND {_lease_fence("o.lease_token", run="r")}
    RETURNING r.id, r.attempts, r.started_at, o.status,
              o.error_type, o.message, o.traceback
),
history AS (
    INSERT INTO job_attempts (run_id, attempt, worker, error_type, message, traceback,
                              started_at, finished_at)
    SELECT id, attempts, %(worker)s, error_type, message, traceback, started_at, {_STATEMENT_NOW}
    FROM done WHERE status IN ('failed', 'dead')
){{logged}}
SELECT id FROM done
"""
RUNS_FINALIZE_MANY = _RUNS_FINALIZE_MANY.format(logged="")

# As RUNS_FINALIZE_MANY, and what the handlers of some of the runs logged (cronjob.runlog),
# kept with the attempt whatever its outcome: for the runs whose write went through, as
# the arrays of those runs alone carry it. A batch in which no handler logged anything
# sends the statement above.
RUNS_FINALIZE_MANY_LOGGED = _RUNS_FINALIZE_MANY.format(
    logged=f""",
logged AS (
    INSERT INTO job_run_logs (run_id, attempt, worker, outcome, events, trimmed, created_at)
    SELECT done.id, done.attempts, %(worker)s, done.status, l.events::jsonb, l.trimmed,
           {_STATEMENT_NOW}
    FROM done
    JOIN unnest(%(log_ids)b::bigint[], %(log_events)b::text[], %(log_trimmed)b::int[])
        AS l(id, events, trimmed) ON l.id = done.id
)"""
)

# Renew every lease this tick holds in one statement; runs missing from the
# result were cancelled or re-claimed, and their handlers must be told.
RUNS_HEARTBEAT_MANY = f"""
UPDATE job_runs r
SET locked_until = {_NOW} + make_interval(secs => o.lease), updated_at = {_NOW}
FROM unnest(%(ids)b::bigint[], %(tokens)b::uuid[], %(leases)b::float8[])
    AS o(id, lease_token, lease)
WHERE r.id = ANY(%(ids)b::bigint[])
  AND r.id = o.id AND {_lease_fence("o.lease_token", run="r")}
RETURNING r.id, r.locked_until
"""

# Unfinished work goes back as if never claimed: due now, the attempt not counted. As the
# claim does, it sets every column the constraints tie to the status, whatever row it is
# built from.
_HAND_BACK = f"""
UPDATE job_runs r
SET status = CASE WHEN r.attempts > 1 THEN 'failed' ELSE 'queued' END,
    attempts = r.attempts - 1,
    run_at = {_NOW},
    finished_at = NULL,
    {_LEASE_RELEASE},
    started_at = NULL,
    updated_at = {_NOW}
"""

RUNS_HAND_BACK_MANY = f"""{_HAND_BACK}
FROM unnest(%(ids)b::bigint[], %(tokens)b::uuid[]) AS o(id, lease_token)
WHERE r.id = ANY(%(ids)b::bigint[])
  AND r.id = o.id AND {_lease_fence("o.lease_token", run="r")}
RETURNING r.id
"""

# Every run one claim still holds, found by the claim's lease token: for a claim whose
# commit took effect but whose answer was lost, so the claimer never learnt its runs.
# Running rows are few, and job_runs_leases indexes exactly them.
RUNS_HAND_BACK_CLAIM = f"""{_HAND_BACK}
WHERE {_lease_fence("%(token)s", run="r")}
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
        {_LEASE_RELEASE},
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

# What a run's handlers logged, attempt by attempt (migration 0019).
RUN_LOGS_GET = """
SELECT attempt, worker, outcome, events::text AS events, trimmed, created_at
FROM job_run_logs WHERE run_id = %(id)s ORDER BY id
"""

# An operator's retry and cancel of the runs named by id: `_RETRY_SET` and `_CANCEL_SET`,
# as for a selection (queries.incidents), and a running run's attempt recorded as
# superseded by the retry. Each run's previous status comes back too.
RUNS_RETRY_MANY = f"""
WITH target AS (
    SELECT {_RETRY_LOCKED} FROM job_runs WHERE id = ANY(%(ids)s) ORDER BY id FOR UPDATE
),
changed AS (
    UPDATE job_runs r {_RETRY_SET}
    FROM target t
    WHERE r.id = t.id AND t.status <> 'succeeded'
    RETURNING r.id
),{_RETRY_SUPERSEDED}
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
    WHERE r.id = t.id AND t.status IN ('queued', 'failed', 'running', 'waiting')
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

# -- the handler's transaction --

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

# -- retention: the end of a finished run, at the end of a tick (cronjob.prune) --

# One batch of pruning, committed on its own so no lock is held for long. The
# terminal statuses are spelled out again here: whatever the caller passes, a
# run that may still execute is never deleted. Attempts and dependencies go with
# their run (ON DELETE CASCADE). A member of a batch that has not ended stays: its
# batch's callback counts it when the last member ends.
RUNS_PRUNE_BATCH = f"""
WITH batch AS MATERIALIZED (
    SELECT id FROM job_runs r
    WHERE status IN ('succeeded', 'dead', 'cancelled') AND status = ANY(%(statuses)s)
      AND finished_at < {_NOW} - make_interval(secs => %(older_than)s)
      AND NOT EXISTS (SELECT 1 FROM job_batches b WHERE b.id = r.batch_id AND b.ended_at IS NULL)
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
gone AS (
    DELETE FROM job_runs r USING batch b WHERE r.id = b.id RETURNING r.status
)
SELECT status, count(*) FROM gone GROUP BY status
"""
