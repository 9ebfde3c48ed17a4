"""Starting promptly (migration 0027): what a listening tick and `jobrunner wait` ask while
they wait, the locks that tell enqueuers someone sleeps, and the table of listening ticks.

Run by cronjob.store.listen. The advisory lock keys are migration 0027's: its header tells
what each one means, and why a sleeper notes the transactions still open once it holds its
lock.
"""

from __future__ import annotations

from cronjob.queries import _NOW, _TICKS_GONE, _claimable

_CHANNEL = "jobrunner"

# Held (shared) by each sleeping tick; held (shared) by each sleeper that wants to hear of
# finishes (a tick whose due runs a limit holds back, `jobrunner wait`).
_SLEEPING = 29958816149106292
_AWAITING_FINISHES = 29958816149106294

TICK_LISTEN = f"LISTEN {_CHANNEL}"
TICK_UNLISTEN = f"UNLISTEN {_CHANNEL}"

# Through a pooler the session that answers is not the one the client was told it talks to
# (the pid of its BackendKeyData, which a pooler makes up to route cancellations), and a LISTEN
# stays with a server connection the pooler hands to other clients.
SESSION_IS_POOLED_BACKEND_PID = "SELECT pg_backend_pid()"

# Going to sleep: this tick sleeps from now on (the lock is the session's, so it goes with a
# lost connection); and wanting to hear of runs that finish too, with due runs a limit holds
# back.
TICK_SLEEP = f"SELECT pg_advisory_lock_shared({_SLEEPING})"
TICK_SLEEP_AWAITING_FINISHES = f"SELECT pg_advisory_lock_shared({_AWAITING_FINISHES})"

# Awake: enqueuers stop notifying for this tick. Each lock this session took once.
TICK_WAKE = f"SELECT pg_advisory_unlock_shared({_SLEEPING})"
TICK_WAKE_FINISHES = f"SELECT pg_advisory_unlock_shared({_AWAITING_FINISHES})"

# The transactions open now: each holds the lock on its own id until it ends (the lock table
# shows every open transaction that has written, of every database; a snapshot would not name
# those begun after the last one that ended). Asked once a sleeper holds its lock, in a
# statement after the one that took it. One that changed runs and saw nobody asleep sent
# nothing, and may commit after the sleeper's next claim: the sleeper claims again once each
# of these has ended; it asks again only while one lasts. As bigint: psycopg has no loader of
# its own for xid, and ids are not reused within the seconds a sleeper looks at them.
TRANSACTIONS_OPEN = """
SELECT transactionid::text::bigint FROM pg_locks
WHERE locktype = 'transactionid' AND mode = 'ExclusiveLock' AND granted
"""
# Which of them are still open.
TRANSACTIONS_OPEN_STILL = """
SELECT x FROM unnest(%(xids)s::bigint[]) AS x
WHERE EXISTS (SELECT 1 FROM pg_locks l
              WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted
                AND l.transactionid::text::bigint = x)
"""

# When a sleeping tick has something to do without being told: the earliest future run_at of
# the runs it could claim (job_runs_waiting_by_time, from now on), a schedule's next fire time
# after `since` (job_definitions_due; `since`: when the tick last materialized, so that a
# schedule it could not materialize waits for the next cron tick as it always did), the next
# start a rate allows a key of one of its types (job_rate_arrivals). And whether a due run
# of its types waits all the same: held back by a limit or by its schedule's overlap policy,
# it may start once a running run finishes. Rescue is left to each tick's start, once a
# minute: a lease renewed by its heartbeats would wake sleepers for nothing.
RUNS_GET_NEXT_DUE = f"""
WITH types AS MATERIALIZED (
    SELECT {_claimable("%(job_types)s")} AS claimable
)
SELECT due.now, least(due.run_at, due.schedule_at, due.window_at) AS due_at,
       due.schedule_at, due.held_back
FROM (SELECT {_NOW} AS now,
(SELECT min(r.run_at) FROM job_runs r
 WHERE r.status IN ('queued', 'failed') AND r.run_at > {_NOW}
   AND r.job_type = ANY((SELECT claimable FROM types)::text[])) AS run_at,
(SELECT min(d.next_fire_at) FROM job_definitions d
 WHERE d.enabled AND d.next_fire_at > coalesce(%(since)s::timestamptz, {_NOW})) AS schedule_at,
(SELECT min(a.next_start) FROM job_rate_arrivals a
 WHERE a.job_type = ANY((SELECT claimable FROM types)::text[])
   AND a.next_start > {_NOW}) AS window_at,
EXISTS (SELECT 1 FROM job_runs r
        WHERE r.status IN ('queued', 'failed') AND r.run_at <= {_NOW}
          AND r.job_type = ANY((SELECT claimable FROM types)::text[])) AS held_back
) due
"""

# Whether a run of the tick's types is due, asked type by type (job_runs_waiting_by_type): a
# tick woken by runs it does not handle asks this before it claims, since a claim walks the
# waiting runs of every type (job_runs_dispatch), a backlog of others' runs included.
RUNS_EXIST_DUE = f"""
SELECT EXISTS (
    SELECT 1 FROM unnest({_claimable("%(job_types)s")}) AS t(job_type)
    CROSS JOIN LATERAL (
        SELECT 1 FROM job_runs r
        WHERE r.job_type = t.job_type AND r.status IN ('queued', 'failed')
          AND r.run_at <= {_NOW}
        -- The index's order: read in it, rather than in a scan of the whole table whose
        -- first due row statistics expect at once.
        ORDER BY coalesce(r.tenant_id, ''), r.priority, r.run_at, r.id
        LIMIT 1
    ) due
)
"""

# How long a tick listens by default: to the end of the database clock's current minute, and
# `overlap` seconds into the next, when cron has started the next minute's tick.
TICK_LISTEN_UNTIL = f"""
SELECT 60 - extract(epoch FROM {_NOW})::numeric %% 60 + %(overlap)s
"""

# -- the ticks that stay: status, metrics and the dashboard show them --

TICKS_INSERT = f"""
INSERT INTO job_ticks (host, pid, started_at, listening_since, poll_interval, last_seen)
VALUES (%(host)s, %(pid)s, {_NOW}, CASE WHEN %(poll_interval)s::float8 IS NULL THEN {_NOW} END,
        %(poll_interval)s, {_NOW})
RETURNING id, started_at
"""
# The row `jobrunner tick` entered (queries.preflight TICK_ENTER) marked as staying:
# listening from now, or polling; and when (the database clock).
TICKS_LISTEN = f"""
UPDATE job_ticks
SET listening_since = CASE WHEN %(poll_interval)s::float8 IS NULL THEN {_NOW} END,
    poll_interval = %(poll_interval)s, last_seen = {_NOW}
WHERE id = %(id)s
RETURNING id, {_NOW}
"""
TICKS_TOUCH = f"UPDATE job_ticks SET last_seen = {_NOW} WHERE id = %(id)s"
TICKS_DELETE = "DELETE FROM job_ticks WHERE id = %(id)s"
# What a tick that worked did, once it ends; and the rows ended long ago go.
TICKS_END = f"""
WITH {_TICKS_GONE.lstrip()}
UPDATE job_ticks
SET ended_at = greatest({_NOW}, started_at), last_seen = greatest({_NOW}, started_at),
    stopped_by = %(stopped_by)s, materialized = %(materialized)s, rescued = %(rescued)s,
    claimed = %(claimed)s, succeeded = %(succeeded)s, failed = %(failed)s, dead = %(dead)s
WHERE id = %(id)s
"""
# The ticks that stay, and have not ended.
_STAYING = "ended_at IS NULL AND (listening_since IS NOT NULL OR poll_interval IS NOT NULL)"
# A row its tick stopped refreshing: the tick was killed, or lost its database for minutes.
TICKS_PRUNE = f"""
UPDATE job_ticks SET ended_at = greatest(last_seen, started_at), stopped_by = 'lost'
WHERE {_STAYING} AND last_seen < {_NOW} - make_interval(secs => %(stale)s)
"""
TICKS_LIST = f"""
SELECT host, pid, started_at, listening_since, poll_interval, last_seen
FROM job_ticks
WHERE {_STAYING} AND last_seen >= {_NOW} - make_interval(secs => %(stale)s)
ORDER BY host, started_at, pid
"""
# The newest ticks that did more than look (an idle tick's row says only that it ran: each
# host's are counted apart, TICKS_COUNT_IDLE_BY_HOST). Through the primary key, newest first.
# A tick that does not stay, open past the time it was bound to end by, was killed: lost.
TICKS_LIST_RECENT = f"""
SELECT host, pid, started_at,
       coalesce(ended_at, CASE WHEN ends_by < {_NOW} THEN ends_by END) AS ended_at,
       last_seen, listening_since, poll_interval,
       CASE WHEN ended_at IS NULL AND ends_by < {_NOW} THEN 'lost' ELSE stopped_by END
           AS stopped_by,
       materialized, rescued, claimed, succeeded, failed, dead
FROM job_ticks
WHERE stopped_by IS DISTINCT FROM 'idle'
ORDER BY id DESC
LIMIT %(limit)s
"""
# For each host that ticked in the last hour: its last tick, and how many found nothing.
TICKS_COUNT_IDLE_BY_HOST = f"""
SELECT host, max(started_at) AS last_started,
       count(*) FILTER (WHERE stopped_by = 'idle')::int AS idle, count(*)::int AS ticks
FROM job_ticks
WHERE started_at >= {_NOW} - interval '1 hour'
GROUP BY host
ORDER BY host
"""

# -- jobrunner wait --

# Waiting: listening, and wanting to hear of runs that finish from now on.
RUNS_WAIT_BEGIN_LISTEN = TICK_LISTEN
RUNS_WAIT_BEGIN = TICK_SLEEP_AWAITING_FINISHES
RUNS_WAIT_END = TICK_WAKE_FINISHES
RUNS_LIST_OUTCOMES = """
SELECT id, status, finished_at FROM job_runs WHERE id = ANY(%(ids)s) ORDER BY id
"""
