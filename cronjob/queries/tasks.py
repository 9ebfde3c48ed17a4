"""Django's Tasks backend (cronjob.django): the task types waiting, a task's return value
and its result, by run id or by result id.

Run by cronjob.store.tasks.
"""

from __future__ import annotations

from cronjob.queries import _lease_fence

# The task types with runs waiting, for a Django tick to look up before it claims; with
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
TASK_RETURN_VALUE_SET = f"""
UPDATE job_runs SET return_value = %(value)s::jsonb
WHERE id = %(id)s AND {_lease_fence("%(token)s")}
"""

# One task run as Django's TaskResult shows it, with its failed attempts in order: by its
# run id (the running task's own context), or by the result id that Django's get_result is
# given (unguessable, and the only way a caller names a result).
_TASK_RESULT = """
SELECT r.id, r.result_id, r.job_type, r.payload::text AS payload, r.status, r.priority,
       r.queue, r.run_at, r.run_after, r.created_at, r.started_at, r.finished_at, r.locked_by,
       r.finished_by, r.return_value::text AS return_value,
       coalesce(a.attempts, '[]') AS attempts
FROM job_runs r
LEFT JOIN LATERAL (
    SELECT json_agg(json_build_object(
               'worker', worker, 'error_type', error_type, 'message', message,
               'traceback', traceback, 'started_at', started_at)
           ORDER BY attempt, id) AS attempts
    FROM job_attempts WHERE run_id = r.id
) a ON true
"""
TASK_RESULT_GET = _TASK_RESULT + "WHERE r.id = %(id)s"
# An index probe of job_runs_result_id (migration 0015).
TASK_RESULT_GET_BY_RESULT_ID = _TASK_RESULT + "WHERE r.result_id = %(result_id)s"
