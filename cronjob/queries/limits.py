"""Job type limits (migrations 0021, 0023): set, cleared and listed by `jobrunner limit`,
`jobrunner limits`, a schedule file's `[limits.TYPE]` tables and Django's settings. The claim
reads them itself (queries.runs.RUNS_CLAIM_MANY, through jobrunner_claimable_limited).

Run by cronjob.store.limits.
"""

from __future__ import annotations

from cronjob.queries import _NOW

_LIMIT_COLUMNS = "job_type, concurrency, rate, rate_period, per, per_field, reason, set_by, set_at"

JOB_TYPE_LIMITS_LIST = f"SELECT {_LIMIT_COLUMNS} FROM job_type_limits ORDER BY job_type"

# A type has one limit: setting it again replaces the whole of it. The keys' next starts
# under the old rate (job_rate_arrivals, migration 0023) go with it, so the new rate counts
# from the next claim.
JOB_TYPE_LIMIT_SET = f"""
WITH forgotten AS (
    DELETE FROM job_rate_arrivals WHERE job_type = %(job_type)s
)
INSERT INTO job_type_limits AS l (job_type, concurrency, rate, rate_period, per, per_field,
                                  reason, set_by, set_at)
VALUES (%(job_type)s, %(concurrency)s, %(rate)s, %(rate_period)s, %(per)s, %(per_field)s,
        %(reason)s, %(actor)s, {_NOW})
ON CONFLICT (job_type) DO UPDATE
SET concurrency = excluded.concurrency, rate = excluded.rate,
    rate_period = excluded.rate_period, per = excluded.per, per_field = excluded.per_field,
    reason = excluded.reason, set_by = excluded.set_by, set_at = excluded.set_at
RETURNING {_LIMIT_COLUMNS}
"""

JOB_TYPE_LIMIT_CLEAR = f"""
WITH forgotten AS (
    DELETE FROM job_rate_arrivals WHERE job_type = %(job_type)s
)
DELETE FROM job_type_limits WHERE job_type = %(job_type)s
RETURNING {_LIMIT_COLUMNS}
"""

# The waiting runs held back by each limited type's limit right now: due, of a limited type,
# and not claimed. For status, metrics and check, which call them throttled, not stuck.
JOB_TYPE_LIMITS_THROTTLED = f"""
SELECT l.job_type, count(r.id) AS due
FROM job_type_limits l
LEFT JOIN job_runs r ON r.job_type = l.job_type AND r.status IN ('queued', 'failed')
                    AND r.run_at <= {_NOW}
GROUP BY l.job_type ORDER BY l.job_type
"""

# The limit of a waiting run's type, if it has one, and whether the run is due: `show` says a
# due run of a limited type waits for its limit.
JOB_TYPE_LIMIT_GET_FOR_RUN = f"""
SELECT {", ".join(f"l.{c.strip()}" for c in _LIMIT_COLUMNS.split(","))},
       r.run_at <= {_NOW} AS due
FROM job_runs r JOIN job_type_limits l ON l.job_type = r.job_type
WHERE r.id = %(id)s AND r.status IN ('queued', 'failed')
"""
