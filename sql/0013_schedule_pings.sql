-- Check-in pings (the Healthchecks / Cronitor convention): a URL called after a scheduled
-- run's success is committed, and one called when it is dead. NULL: no pings.
ALTER TABLE job_definitions
    ADD COLUMN ping_url text CHECK (length(ping_url) <= 2048),
    ADD COLUMN ping_failure_url text CHECK (length(ping_failure_url) <= 2048);

-- A busy tick asks once which definitions ping; with none, this index is empty and the
-- question costs nothing however many definitions there are.
CREATE INDEX job_definitions_pinging ON job_definitions (id) WHERE ping_url IS NOT NULL;
