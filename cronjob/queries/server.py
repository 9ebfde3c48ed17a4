"""The server's own state, beside the queue's tables: what holds back cleanup of the queue's
database, who holds jobrunner's advisory locks, and whether a session takes writes.

Run by cronjob.store.server. Nothing here reads jobrunner's tables but the limits (a
handful of rows): what it costs follows the server's sessions, locks and slots, never the
runs kept.
"""

from __future__ import annotations

from cronjob.queries import _NOW
from cronjob.queries.definitions import DEFINITIONS_SYNC_LOCK_KEY
from cronjob.queries.enqueue import RUNS_KEYED_BATCH_LOCK_KEY
from cronjob.queries.preflight import MIGRATIONS_LOCK_ALONE_KEY, MIGRATIONS_LOCK_KEY
from cronjob.queries.tally import RUN_TALLY_FOLD_LOCK_KEY

# What holds VACUUM's xmin horizon back for the queue's tables, oldest first: sessions whose
# transaction holds a snapshot or a transaction id, prepared transactions, and replication
# slots holding an xmin (a standby's hot_standby_feedback through its slot). A session in
# another database holds this one back only through a transaction id, which every snapshot
# taken here must still treat as running. Left out: this statement's own backend; VACUUM
# (autovacuum's xmin is ignored by every other VACUUM); parallel workers, which share their
# leader's snapshot; a logical slot's catalog_xmin, which holds back the system catalogs
# only. A role without pg_read_all_stats sees other users' sessions without their state,
# start or query (its state is NULL then): those come last, their age unknown.
# `inactive_since` is PostgreSQL 17's, read through to_jsonb so that older servers run the
# same statement.
SERVER_LIST_SNAPSHOT_HOLDERS = f"""
SELECT kind, name, pid, application_name, user_name, state, database, xmin_age, since,
       extract(epoch FROM {_NOW} - since)::float8 AS age, query, visible
FROM (
    SELECT 'session' AS kind, NULL::text AS name, a.pid, a.application_name,
           a.usename::text AS user_name, a.state,
           nullif(a.datname::text, current_database()) AS database,
           greatest(age(a.backend_xmin), age(a.backend_xid)) AS xmin_age,
           a.xact_start AS since,
           CASE WHEN a.state IS NOT NULL THEN left(a.query, 1000) END AS query,
           a.state IS NOT NULL AS visible
    FROM pg_stat_activity a
    WHERE a.pid <> pg_backend_pid()
      AND (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
      AND (a.datname = current_database() OR a.datname IS NULL OR a.backend_xid IS NOT NULL)
      AND a.backend_type IS DISTINCT FROM 'autovacuum worker'
      AND (a.leader_pid IS NULL OR a.leader_pid = a.pid)
    UNION ALL
    SELECT 'prepared transaction', p.gid, NULL, NULL, p.owner::text, 'prepared', NULL,
           age(p.transaction), p.prepared, NULL, true
    FROM pg_prepared_xacts p
    WHERE p.database = current_database()
    UNION ALL
    SELECT 'replication slot', s.slot_name::text, s.active_pid, NULL, NULL,
           CASE WHEN s.active THEN 'active' ELSE 'inactive' END,
           nullif(s.database::text, current_database()),
           age(s.xmin), (to_jsonb(s) ->> 'inactive_since')::timestamptz, NULL, true
    FROM pg_replication_slots s
    WHERE s.xmin IS NOT NULL
) holders
ORDER BY since NULLS LAST, xmin_age DESC NULLS LAST, pid
LIMIT %(limit)s
"""

# What libpq's target_session_attrs=read-write asks of a server before it keeps a
# connection: on on a standby, and where default_transaction_read_only is on.
SESSION_READ_ONLY = "SELECT current_setting('transaction_read_only')"

# jobrunner's advisory locks, each as pg_locks shows a lock taken on one bigint: its key's
# high and low halves in classid and objid, objsubid 1.
_JOBRUNNER_LOCKS = ", ".join(
    f"({key}, '{name}')"
    for key, name in (
        (MIGRATIONS_LOCK_KEY, "migrations"),
        (MIGRATIONS_LOCK_ALONE_KEY, "a migration outside a transaction"),
        (DEFINITIONS_SYNC_LOCK_KEY, "schedule sync"),
        (RUN_TALLY_FOLD_LOCK_KEY, "finished-run tally fold"),
        (RUNS_KEYED_BATCH_LOCK_KEY, "keyed-batch enqueue"),
    )
)

# Which session holds which of jobrunner's advisory locks in the queue's database: the locks
# above, and a key's lock of each limited type (two 32-bit halves, the type's in classid,
# jobrunner_limit_lock_class, migration 0023). Any login may take any advisory lock: one
# that holds a key's lock holds back that key's runs, one that holds the keyed-batch lock
# holds back every enqueue of a batch with keys (docs/explanation/security.md). A session of another
# login shows no state or transaction start to a role without pg_read_all_stats.
SERVER_LIST_ADVISORY_LOCKS = f"""
SELECT coalesce(o.name, 'a key of limited type') AS lock, t.job_type, l.pid,
       a.usename::text AS user_name, a.application_name, a.state,
       extract(epoch FROM {_NOW} - a.xact_start)::float8 AS age
FROM pg_locks l
LEFT JOIN pg_stat_activity a ON a.pid = l.pid
LEFT JOIN (VALUES {_JOBRUNNER_LOCKS}) AS o(key, name)
    ON l.objsubid = 1 AND ((l.classid::bigint << 32) | l.objid::bigint) = o.key
LEFT JOIN job_type_limits t
    ON l.objsubid = 2 AND l.classid = jobrunner_limit_lock_class(t.job_type)::oid
WHERE l.locktype = 'advisory' AND l.granted AND l.pid <> pg_backend_pid()
  AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
  AND (o.name IS NOT NULL OR t.job_type IS NOT NULL)
ORDER BY a.xact_start NULLS LAST, l.pid, 1, 2
LIMIT %(limit)s
"""
