-- Schedule health: each definition's last success and last failure, kept as its runs finish,
-- so `check --stale-schedules`, `status` and `metrics` read one row per schedule however long
-- the history is. For a tenant-scoped definition the newest success of any tenant counts.

-- Seconds within which a due occurrence must have succeeded; NULL: derived from the
-- expression (two intervals plus the default lease).
ALTER TABLE job_definitions
    ADD COLUMN expect_within integer CHECK (expect_within > 0);

-- Apart from job_definitions on purpose: a run finishing must never hold a lock that a tick
-- materializing the definition (FOR UPDATE SKIP LOCKED) would then step over.
CREATE TABLE job_schedule_health (
    definition_id      bigint PRIMARY KEY,
    last_success_at    timestamptz,  -- when the run finished
    last_success_for   timestamptz,  -- the occurrence it ran for
    last_failure_at    timestamptz,
    last_failure_for   timestamptz,
    last_failure_error text
);

-- Moves a mark only forward, and only for a newer occurrence: the other tenants of an
-- occurrence already noted update nothing and lock nothing.
CREATE FUNCTION jobrunner_note_schedule_outcome() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM job_schedule_health WHERE definition_id = NEW.definition_id)
    THEN
        INSERT INTO job_schedule_health (definition_id) VALUES (NEW.definition_id)
        ON CONFLICT DO NOTHING;
    END IF;
    IF NEW.status = 'succeeded' THEN
        UPDATE job_schedule_health
        SET last_success_at = NEW.finished_at, last_success_for = NEW.scheduled_for
        WHERE definition_id = NEW.definition_id
          AND (last_success_for IS NULL OR last_success_for < NEW.scheduled_for);
    ELSE
        UPDATE job_schedule_health
        SET last_failure_at = NEW.updated_at, last_failure_for = NEW.scheduled_for,
            last_failure_error = left(NEW.last_error, 500)
        WHERE definition_id = NEW.definition_id
          AND (last_failure_for IS NULL OR last_failure_for < NEW.scheduled_for);
    END IF;
    RETURN NULL;
END
$$;

-- Only scheduled runs reaching an outcome pay for the function; for every other update
-- of job_runs (claims, heartbeats, runs enqueued by hand) the WHEN test is all it costs.
CREATE TRIGGER job_runs_note_schedule_outcome
    AFTER UPDATE OF status ON job_runs
    FOR EACH ROW
    WHEN (NEW.definition_id IS NOT NULL AND NEW.status IN ('succeeded', 'failed', 'dead')
          AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION jobrunner_note_schedule_outcome();

CREATE FUNCTION jobrunner_forget_schedule_health() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM job_schedule_health WHERE definition_id = OLD.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER job_definitions_forget_health
    AFTER DELETE ON job_definitions
    FOR EACH ROW EXECUTE FUNCTION jobrunner_forget_schedule_health();

-- As every function jobrunner installs (see 0007, 0010): names resolve in its own schema,
-- then pg_temp, last, whatever the search_path of the session that fires it.
SELECT jobrunner_pin_search_paths();
