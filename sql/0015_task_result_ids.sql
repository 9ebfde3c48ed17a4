-- Django Tasks (cronjob.django): each run's result id, a random UUID the backend gives it at
-- enqueue. A result was looked up by its run id, which anyone can count through; this id
-- cannot be guessed. NULL for runs enqueued any other way, and for task runs enqueued
-- before this migration (their results are no longer reachable by id). A nullable column
-- without a default: no rewrite of the table, and its lock is held for an instant.
ALTER TABLE job_runs ADD COLUMN result_id uuid;

-- get_result is one probe of this index. Built here, inside the migration's transaction
-- (CREATE INDEX CONCURRENTLY cannot run in one), so writes to job_runs wait while it is
-- built; reads do not. Partial: the column is empty for everything but Django's runs, so
-- building it is one sequential read of the table with nothing to sort (about 0.25 s per
-- million rows when the table is in memory, a quarter of what indexing every row's NULL
-- costs), and it stays as small as the task runs it holds. The runner's statement_timeout
-- (30 s) bounds that wait: on a table too large to read in that time the migration fails
-- whole and changes nothing; prune the finished history first (`jobrunner prune`), or
-- migrate at a quiet hour with a longer timeout (PGOPTIONS='-c statement_timeout=0').
CREATE UNIQUE INDEX job_runs_result_id ON job_runs (result_id) WHERE result_id IS NOT NULL;
