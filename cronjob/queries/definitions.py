"""Schedules: their definitions, materializing their runs, their health, pings and skips,
and the lock `schedule sync` takes.

Run by cronjob.store.definitions. The runs a schedule creates are written here too
(RUNS_MATERIALIZE_*): materializing is a schedule's step, run under its row lock.
"""

from __future__ import annotations

from cronjob.queries import _NOW

DEFINITIONS_LIST_SCHEDULES = """
SELECT name, job_type, schedule, timezone, enabled, next_fire_at, overlap, overlap_skips
FROM job_definitions
ORDER BY enabled DESC, next_fire_at NULLS LAST, name
"""

_DEFINITION_COLUMNS = (
    "id, name, job_type, payload, schedule, timezone, scope, max_attempts, priority, catch_up,"
    " catch_up_limit, overlap, overlap_skips, expect_within, ping_url, ping_failure_url,"
    " enabled, materialized_through, next_fire_at, created_at, updated_at, then_type"
)

# A definition starts from the moment it is created: its high-water mark is that moment, so
# nothing before it is ever materialized.
DEFINITION_INSERT = f"""
INSERT INTO job_definitions (name, job_type, payload, schedule, timezone, scope, max_attempts,
                             priority, catch_up, catch_up_limit, overlap, expect_within,
                             ping_url, ping_failure_url, enabled, materialized_through,
                             next_fire_at, created_at, updated_at, then_type)
VALUES (%(name)s, %(job_type)s, %(payload)s::jsonb, %(schedule)s, %(timezone)s, %(scope)s,
        %(max_attempts)s, %(priority)s, %(catch_up)s, %(catch_up_limit)s, %(overlap)s,
        %(expect_within)s, %(ping_url)s, %(ping_failure_url)s, %(enabled)s, %(now)s,
        %(next_fire_at)s, %(now)s, %(now)s, %(then_type)s)
ON CONFLICT (name) DO NOTHING
RETURNING {_DEFINITION_COLUMNS}
"""

DEFINITION_UPDATE = f"""
UPDATE job_definitions
SET job_type = %(job_type)s, payload = %(payload)s::jsonb, schedule = %(schedule)s,
    timezone = %(timezone)s, scope = %(scope)s, max_attempts = %(max_attempts)s,
    priority = %(priority)s, catch_up = %(catch_up)s, catch_up_limit = %(catch_up_limit)s,
    overlap = %(overlap)s, expect_within = %(expect_within)s, ping_url = %(ping_url)s,
    ping_failure_url = %(ping_failure_url)s, enabled = %(enabled)s, then_type = %(then_type)s,
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
       materialized_through, then_type
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
                      max_attempts, priority, created_at, updated_at, batch_id)
SELECT d.id, d.job_type, d.payload, t.tenant_id, o.scheduled_for, o.scheduled_for,
       d.max_attempts, d.priority, %(now)s, %(now)s, o.batch_id
FROM job_definitions d
CROSS JOIN (
    -- Each occurrence's batch, for a schedule with `then` (queries.batches).
    SELECT s.scheduled_for, b.id AS batch_id
    FROM unnest(%(scheduled_fors)s::timestamptz[]) AS s(scheduled_for)
    LEFT JOIN job_batches b ON b.definition_id = %(id)s AND b.scheduled_for = s.scheduled_for
) AS o
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
DEFINITIONS_SYNC_LOCK_KEY = 7669456938163791204
DEFINITIONS_LOCK_FOR_SYNC = f"SELECT pg_advisory_xact_lock({DEFINITIONS_SYNC_LOCK_KEY})"
DEFINITIONS_LOCK_FOR_SYNC_TRY = f"SELECT pg_try_advisory_xact_lock({DEFINITIONS_SYNC_LOCK_KEY})"
