"""What the dashboard (cronjob.web) reads beyond what `status` reads: a page of runs, a page
of the audit trail, and the last day's outcomes for its charts.

Run by cronjob.store.dashboard. Every statement here costs the same however much finished
history the table keeps: pages are keyset pages walked down the primary key (never OFFSET),
bounded by an id window when a filter may match few runs among many, and the charts read
the last day alone, through the index on `finished_at`.
"""

from __future__ import annotations

import dataclasses

from cronjob.models import Run
from cronjob.queries import _AUDIT_ENTRIES, _NOW

# A run as a listing shows it: every field of models.Run but the payload, which a page of
# runs never shows (a payload can be a megabyte).
_RUN_PAGE_COLUMNS = ", ".join(
    "NULL AS payload" if field.name == "payload" else field.name
    for field in dataclasses.fields(Run)
)

# The newest and the oldest id: two probes of the primary key, from which a page's window
# is placed.
RUNS_LIST_PAGE_BOUNDS = "SELECT min(id), max(id) FROM job_runs"

# The filters of a page of runs, each NULL when not given.
_RUNS_PAGE_FILTER = """
  AND (%(job_types)s::text[] IS NULL OR job_type = ANY(%(job_types)s::text[]))
  AND (%(tenants)s::text[] IS NULL OR tenant_id = ANY(%(tenants)s::text[]))
  AND (%(error_types)s::text[] IS NULL OR error_type = ANY(%(error_types)s::text[]))
  AND (%(definition_id)s::bigint IS NULL OR definition_id = %(definition_id)s::bigint)
  AND (%(batch_id)s::bigint IS NULL OR batch_id = %(batch_id)s::bigint)
  AND (%(since)s::timestamptz IS NULL
       OR coalesce(finished_at, updated_at) >= %(since)s::timestamptz)
  AND (%(until)s::timestamptz IS NULL
       OR coalesce(finished_at, updated_at) < %(until)s::timestamptz)
"""
# One page of runs, newest first, below the id `before` and at or above `floor`: the lowest
# id when the primary key finds the runs whatever the history (no filter), else a bound on
# the ids the page may read; the next page searches below it.
RUNS_LIST_PAGE = f"""
SELECT {_RUN_PAGE_COLUMNS} FROM job_runs
WHERE id < %(before)s AND id >= %(floor)s
  AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[])){_RUNS_PAGE_FILTER}
ORDER BY id DESC
LIMIT %(limit)s
"""

# The runs of a filter by status, among the ids at or above `floor` (the newest window of
# ids a page reads): the status tabs of a page of runs, their cost bounded by the window
# through the primary key however long the history.
RUNS_COUNT_BY_STATUS = f"""
SELECT status, count(*) AS runs FROM job_runs
WHERE id >= %(floor)s{_RUNS_PAGE_FILTER}
GROUP BY status
"""

# A page of unfinished runs only: each arm names the statuses of a partial index (runnable,
# running) in its own words, so that the index is what finds its rows whatever the history,
# rather than a walk down the primary key past every finished run. Neither index is in id
# order, so an arm reads all it finds to sort it: the running arm as many runs as are
# running, the waiting arm the ids of the window at most (`floor`, through the primary key),
# whatever the backlog.
RUNS_LIST_PAGE_UNFINISHED = f"""
SELECT * FROM (
    SELECT {_RUN_PAGE_COLUMNS} FROM job_runs
    WHERE status IN ('queued', 'failed') AND status = ANY(%(statuses)s::text[]){_RUNS_PAGE_FILTER}
    UNION ALL
    SELECT {_RUN_PAGE_COLUMNS} FROM job_runs
    WHERE status = 'running' AND status = ANY(%(statuses)s::text[]){_RUNS_PAGE_FILTER}
) AS unfinished
WHERE id < %(before)s AND id >= %(floor)s
ORDER BY id DESC
LIMIT %(limit)s
"""

# The trace a run belongs to: the enqueuer's W3C trace context (migration 0018), which each
# attempt's span continues.
RUN_GET_TRACEPARENT = "SELECT traceparent FROM job_runs WHERE id = %(id)s"

# One page of the audit trail, newest first, below the id `before`.
AUDIT_LIST_PAGE = f"""{_AUDIT_ENTRIES}
WHERE a.id < %(before)s
ORDER BY a.id DESC
LIMIT %(limit)s
"""

# The last day, a row per minute: runs finished by outcome, and the longest a run that
# started in that minute had waited since it was due (its queue age when claimed). Finished
# runs are read through job_runs_finished, running ones through job_runs_leases: the cost
# follows the day's throughput, not the history kept.
RUNS_CHART_LAST_DAY = f"""
WITH recent AS (
    SELECT status, finished_at, started_at, run_at FROM job_runs
    WHERE finished_at > {_NOW} - interval '1 day' AND finished_at <= {_NOW}
    UNION ALL
    SELECT status, NULL, started_at, run_at FROM job_runs WHERE status = 'running'
),
finished AS (
    SELECT date_trunc('minute', finished_at) AS minute,
           count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
           count(*) FILTER (WHERE status = 'dead') AS dead,
           count(*) FILTER (WHERE status = 'cancelled') AS cancelled
    FROM recent WHERE finished_at IS NOT NULL
    GROUP BY 1
),
started AS (
    SELECT date_trunc('minute', started_at) AS minute,
           max(greatest(extract(epoch FROM started_at - run_at), 0))::float8 AS longest_wait
    FROM recent WHERE started_at > {_NOW} - interval '1 day'
    GROUP BY 1
)
SELECT minute, coalesce(f.succeeded, 0) AS succeeded, coalesce(f.dead, 0) AS dead,
       coalesce(f.cancelled, 0) AS cancelled, s.longest_wait
FROM finished f FULL JOIN started s USING (minute)
ORDER BY minute
"""
