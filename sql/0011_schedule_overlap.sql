-- Overlap policy per schedule: what an occurrence does while an earlier run of the same
-- schedule (and tenant) has not finished. 'allow' runs it anyway (the behaviour before this
-- migration), 'skip' records it as skipped, 'queue' lets one run wait and skips the rest.
ALTER TABLE job_definitions
    ADD COLUMN overlap text NOT NULL DEFAULT 'allow'
        CHECK (overlap IN ('allow', 'skip', 'queue')),
    -- Occurrences skipped by the policy since the definition was created: the metric, kept
    -- here so that reading it never scans history.
    ADD COLUMN overlap_skips bigint NOT NULL DEFAULT 0;

-- Runs materialized under 'skip' or 'queue' are exclusive: one is claimed only while no other
-- run of its schedule and tenant is running and no older one is still waiting. Constant
-- default: adding the column rewrites nothing.
ALTER TABLE job_runs ADD COLUMN exclusive boolean NOT NULL DEFAULT false;

-- The unfinished exclusive runs of a schedule and tenant: what the claim and the materializer
-- look at. Only unfinished runs are in it, so it stays as small as the work in flight.
CREATE INDEX job_runs_exclusive_unfinished
    ON job_runs (definition_id, (coalesce(tenant_id, '')), id)
    WHERE exclusive AND status IN ('queued', 'running', 'failed');

-- The occurrences the policy did not run, with their reason: `schedule show` lists the recent
-- ones. The materializer keeps the newest thousand per definition; the count is on the
-- definition.
CREATE TABLE job_schedule_skips (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    definition_id bigint NOT NULL REFERENCES job_definitions (id) ON DELETE CASCADE,
    tenant_id     text,
    scheduled_for timestamptz NOT NULL,
    reason        text NOT NULL,
    created_at    timestamptz NOT NULL
);
CREATE INDEX job_schedule_skips_definition ON job_schedule_skips (definition_id, id);
CREATE INDEX job_schedule_skips_created ON job_schedule_skips (created_at);
