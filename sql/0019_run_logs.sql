-- Run logs: what a handler logged while it ran (cronjob.runlog), one row per attempt that
-- logged anything, whatever its outcome: a succeeded attempt's lines live here too (the
-- attempt history, job_attempts, holds failed attempts only). Written by the finalize that
-- records the attempt's outcome, in the same statement. `events` is a JSON array of the
-- attempt's newest events (capped), `trimmed` how many older ones were dropped.
-- Attempt numbers repeat after an operator's retry of a dead run (its budget starts
-- again), so (run_id, attempt) is no key; the rows go with their run (ON DELETE CASCADE:
-- prune's batches delete them by the index below).
CREATE TABLE job_run_logs (
    id          bigserial PRIMARY KEY,
    run_id      bigint NOT NULL REFERENCES job_runs (id) ON DELETE CASCADE,
    attempt     integer NOT NULL,
    worker      text,
    outcome     text NOT NULL,
    events      jsonb NOT NULL,
    trimmed     integer NOT NULL DEFAULT 0 CHECK (trimmed >= 0),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX job_run_logs_run ON job_run_logs (run_id, attempt);
