-- Django Tasks (cronjob.django): the run_after a task was enqueued with, as Django's
-- TaskResult.task carries it (`task.using(run_after=...)`); run_at moves on with retries,
-- this stays. NULL for runs enqueued any other way, and for tasks enqueued with none. A
-- nullable column without a default: no rewrite of the table.
ALTER TABLE job_runs ADD COLUMN run_after timestamptz;
