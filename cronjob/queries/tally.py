"""What `status`, `metrics` and `check` read: the snapshot of runs, the finished-run tally,
run times, and the database clock.

Run by cronjob.store.tally.
"""

from __future__ import annotations

from cronjob.queries import _NOW

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
waiting AS (
    SELECT r.job_type, r.status, count(*) AS runs, 0::bigint AS due, 0::bigint AS expired_leases,
           NULL::timestamptz AS oldest_due_at, NULL::timestamptz AS last_started_at
    FROM job_runs r
    WHERE r.status = 'waiting'
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
    SELECT * FROM runnable UNION ALL SELECT * FROM running UNION ALL SELECT * FROM waiting
    UNION ALL SELECT * FROM finished
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
RUN_TALLY_FOLD_LOCK_KEY = 7669456938163791205
RUN_TALLY_COMPACT = f"""
WITH folding AS (SELECT pg_try_advisory_xact_lock({RUN_TALLY_FOLD_LOCK_KEY}) AS mine),
gone AS (
    DELETE FROM job_run_tally WHERE (SELECT mine FROM folding)
    RETURNING job_type, status, runs, last_started_at
)
INSERT INTO job_run_tally (job_type, status, runs, last_started_at)
SELECT job_type, status, sum(runs), max(last_started_at) FROM gone
GROUP BY job_type, status
HAVING sum(runs) <> 0
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

# The one clock anything stored comes from (or the pinned `now`).
CLOCK_NOW = f"SELECT {_NOW}"
