"""What runs before any work: is there work, the migrations, waiting for another host.

Run by cronjob.store.preflight. An idle tick runs TICK_WORK_EXISTS and nothing else,
so this module imports only the shared fragments.
"""

from __future__ import annotations

from cronjob.queries import _NOW, _TICKS_GONE, _claimable

# One question before a tick sets anything up: is there a due run of a type this
# tick handles, a lease to rescue, or a schedule to materialize? Most ticks on most
# hosts find nothing, and then cost this one round trip.
# Its second column, asked only when there is no work: is a run due of a type this tick has
# no handler for (then the tick names such types, HANDLERS_SEEN_MISSING_DUE).
TICK_WORK_EXISTS = f"""
SELECT work, CASE WHEN work THEN false ELSE EXISTS (
           SELECT 1 FROM job_runs
           WHERE status IN ('queued', 'failed') AND run_at <= {_NOW}
             AND job_type <> ALL(%(job_types)s::text[])) END
FROM (SELECT EXISTS (SELECT 1 FROM job_runs
                     WHERE status IN ('queued', 'failed') AND run_at <= {_NOW}
                       AND job_type = ANY({_claimable("%(job_types)s")}))
          OR EXISTS (SELECT 1 FROM job_runs WHERE status = 'running' AND locked_until < {_NOW})
          OR EXISTS (SELECT 1 FROM job_definitions WHERE enabled AND next_fire_at <= {_NOW})
      AS work) probe
"""


# TICK_WORK_EXISTS, and the tick's row in job_ticks (migration 0028) in the same statement:
# a tick with nothing to do (and that does not stay) enters its row ended, and asks nothing
# more; any other tick's row is open until it ends (TICKS_END). Its id is the third column.
TICK_ENTER = f"""
WITH probe (work, others_due) AS MATERIALIZED ({TICK_WORK_EXISTS}),
entered AS (
    INSERT INTO job_ticks (host, pid, started_at, last_seen, ended_at, stopped_by, ends_by)
    SELECT %(host)s, %(pid)s, {_NOW}, {_NOW},
           CASE WHEN NOT (p.work OR %(listen)s) THEN {_NOW} END,
           CASE WHEN NOT (p.work OR %(listen)s) THEN 'idle' END,
           CASE WHEN NOT %(listen)s THEN {_NOW} + make_interval(secs => %(ends_within)s) END
    FROM probe p
    RETURNING id
),{_TICKS_GONE}
SELECT p.work, p.others_due, e.id FROM probe p CROSS JOIN entered e
"""

# -- which job types ticks have handlers for (job_handlers_seen, migration 0025) --

# Once per tick that found work: rows younger than 5 minutes are left as they are,
# so most ticks write nothing; types no tick has handled for 30 days go.
HANDLERS_SEEN_RECORD = f"""
WITH gone AS (DELETE FROM job_handlers_seen WHERE seen_at < {_NOW} - interval '30 days')
INSERT INTO job_handlers_seen AS s (job_type, host, seen_at)
SELECT t, %(host)s, {_NOW} FROM unnest(%(job_types)s::text[]) AS t
ON CONFLICT (job_type) DO UPDATE SET host = excluded.host, seen_at = excluded.seen_at
WHERE s.seen_at < excluded.seen_at - interval '5 minutes'
"""

# The job types of due runs that neither `job_types` (the asking tick's) nor any tick seen
# recently has a handler for. Bounded: the first 1000 due runs of other types are looked at,
# a few types named.
HANDLERS_SEEN_MISSING_DUE = f"""
SELECT DISTINCT due.job_type FROM (
    SELECT job_type FROM job_runs
    WHERE status IN ('queued', 'failed') AND run_at <= {_NOW}
      AND job_type <> ALL(%(job_types)s::text[])
    LIMIT 1000) due
WHERE NOT EXISTS (SELECT 1 FROM job_handlers_seen s
                  WHERE s.job_type = due.job_type
                    AND s.seen_at >= {_NOW} - interval '1 hour')
ORDER BY due.job_type LIMIT %(most)s
"""

# -- schema: the migrations applied, and applying them --

MIGRATIONS_GET_LATEST_VERSION = "SELECT coalesce(max(version), 0) FROM jobrunner_migrations"

# Transaction-scoped, so it works behind PgBouncer in transaction mode. Any constant
# works; this one spells "jobrunr" (0x6A6F6272756E72) and only has to be unique per
# database.
MIGRATIONS_LOCK_KEY = 29958816149106290
MIGRATIONS_LOCK = f"SELECT pg_advisory_xact_lock({MIGRATIONS_LOCK_KEY})"
MIGRATIONS_LOCK_TRY = f"SELECT pg_try_advisory_xact_lock({MIGRATIONS_LOCK_KEY})"

# A migration that cannot run in a transaction (its first line says so: cronjob.migrate) is
# built on a connection of its own while a transaction of the migrating connection holds
# this lock, another one than the above: while a host builds an index concurrently, the
# others still take that one in their transactions, find this one held, and ask again a
# moment later (cronjob.locks.holding), so that none of them waits inside a statement whose
# snapshot the build would wait for in turn. The holder sits idle in its transaction for as
# long as the build takes: the runner's idle_in_transaction_session_timeout is lifted for it.
MIGRATIONS_LOCK_ALONE_KEY = 29958816149106291
MIGRATIONS_LOCK_ALONE = f"SELECT pg_advisory_xact_lock({MIGRATIONS_LOCK_ALONE_KEY})"
MIGRATIONS_LOCK_ALONE_TRY = f"SELECT pg_try_advisory_xact_lock({MIGRATIONS_LOCK_ALONE_KEY})"
MIGRATIONS_LOCK_ALONE_HOLD = "SELECT set_config('idle_in_transaction_session_timeout', '0', true)"

# -- waiting for another host: for the migration lock, the sync lock (queries.definitions)
# or the keyed batch lock of enqueue (queries.enqueue) --

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

# -- a migration applied outside a transaction, a statement at a time --

# An index such a migration builds, left INVALID by a build that did not finish (a crash, a
# cancel, a timeout): `CREATE INDEX CONCURRENTLY IF NOT EXISTS` would take it for done.
# Resolved through the search_path, as the migration's own statements are.
MIGRATION_APPLY_ALONE_INVALID_INDEXES = """
SELECT name FROM unnest(%(names)s::text[]) AS name
JOIN pg_index i ON i.indexrelid = to_regclass(quote_ident(name))
WHERE NOT i.indisvalid
"""
# Composed with the index's name as an identifier (psycopg.sql).
MIGRATION_APPLY_ALONE_DROP_INDEX = "DROP INDEX CONCURRENTLY IF EXISTS {index}"

# -- watching a migration as it goes --

# What the backend applying a migration does: its wait, and for an index build the phase
# and counts PostgreSQL reports (pg_stat_progress_create_index). `holder` is the session it
# waits for: the transaction a concurrent build waits out, else the first that holds a lock
# it queues for. Another login's session shows its pid alone, unless this one may read the
# statistics of all (pg_read_all_stats).
MIGRATION_ACTIVITY = """
SELECT a.wait_event_type, a.wait_event, p.phase,
       p.blocks_done, p.blocks_total, p.tuples_done, p.tuples_total,
       p.lockers_done, p.lockers_total,
       holder.pid AS holder_pid, holder.state AS holder_state,
       extract(epoch FROM now() - holder.xact_start)::float8 AS holder_seconds
FROM pg_stat_activity a
LEFT JOIN pg_stat_progress_create_index p ON p.pid = a.pid
LEFT JOIN LATERAL (
    SELECT b.pid, b.state, b.xact_start FROM pg_stat_activity b
    WHERE b.pid = coalesce(nullif(p.current_locker_pid, 0), (pg_blocking_pids(a.pid))[1])
) holder ON true
WHERE a.pid = %(pid)s
"""
