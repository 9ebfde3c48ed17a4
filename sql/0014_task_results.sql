-- Django Tasks (cronjob.django): the queue a task was enqueued to, the JSON its function
-- returned, and the worker that finished the run (TaskResult.worker_ids). NULL for runs
-- enqueued any other way. No CHECK: adding one would scan the whole history to validate it.
ALTER TABLE job_runs
    ADD COLUMN queue text,
    ADD COLUMN return_value jsonb,
    ADD COLUMN finished_by text;

-- A Django tick asks which task types have runs waiting before it claims: an index-only
-- scan over waiting task runs, empty (and free) on a database that holds none.
CREATE INDEX job_runs_waiting_tasks ON job_runs (queue, job_type)
    WHERE queue IS NOT NULL AND status IN ('queued', 'failed');
