-- Finished runs counted as they finish, so `status`, `metrics` and `check` never scan
-- finished history: active runs are read through the partial indexes over runnable and
-- running rows, finished ones from this small table.
--
-- Append-only deltas: one row per (job type, finished status) that a statement changed,
-- written once per statement by a statement-level trigger over its transition tables.
-- Concurrent ticks never contend for a counter row, and no per-row trigger runs on the
-- tick's hot path. Readers sum the rows; a tick that did work folds them back into one
-- row per (job type, status) at its end.
CREATE TABLE job_run_tally (
    job_type         text NOT NULL,
    status           text NOT NULL,
    runs             bigint NOT NULL,
    -- The latest start among the runs this row counts: with the running and runnable
    -- rows' own, when a run of the type last started, without max() over history.
    last_started_at  timestamptz
);

CREATE FUNCTION jobrunner_tally_inserted_runs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_run_tally (job_type, status, runs, last_started_at)
    SELECT job_type, status, count(*), max(started_at) FROM jobrunner_new
    WHERE status IN ('succeeded', 'dead', 'cancelled')
    GROUP BY job_type, status;
    RETURN NULL;
END
$$;

CREATE FUNCTION jobrunner_tally_updated_runs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_run_tally (job_type, status, runs, last_started_at)
    SELECT job_type, status, sum(change), max(started_at)
    FROM (
        SELECT job_type, status, 1 AS change, started_at FROM jobrunner_new
        WHERE status IN ('succeeded', 'dead', 'cancelled')
        UNION ALL
        SELECT job_type, status, -1, NULL FROM jobrunner_old
        WHERE status IN ('succeeded', 'dead', 'cancelled')
    ) AS moved
    GROUP BY job_type, status
    HAVING sum(change) <> 0;
    RETURN NULL;
END
$$;

CREATE FUNCTION jobrunner_tally_deleted_runs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_run_tally (job_type, status, runs)
    SELECT job_type, status, -count(*) FROM jobrunner_old
    WHERE status IN ('succeeded', 'dead', 'cancelled')
    GROUP BY job_type, status;
    RETURN NULL;
END
$$;

CREATE FUNCTION jobrunner_tally_truncated_runs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM job_run_tally;
    RETURN NULL;
END
$$;

CREATE TRIGGER job_runs_tally_insert AFTER INSERT ON job_runs
    REFERENCING NEW TABLE AS jobrunner_new
    FOR EACH STATEMENT EXECUTE FUNCTION jobrunner_tally_inserted_runs();

CREATE TRIGGER job_runs_tally_update AFTER UPDATE ON job_runs
    REFERENCING OLD TABLE AS jobrunner_old NEW TABLE AS jobrunner_new
    FOR EACH STATEMENT EXECUTE FUNCTION jobrunner_tally_updated_runs();

CREATE TRIGGER job_runs_tally_delete AFTER DELETE ON job_runs
    REFERENCING OLD TABLE AS jobrunner_old
    FOR EACH STATEMENT EXECUTE FUNCTION jobrunner_tally_deleted_runs();

CREATE TRIGGER job_runs_tally_truncate AFTER TRUNCATE ON job_runs
    FOR EACH STATEMENT EXECUTE FUNCTION jobrunner_tally_truncated_runs();

-- What history there is now, counted once.
INSERT INTO job_run_tally (job_type, status, runs, last_started_at)
SELECT job_type, status, count(*), max(started_at) FROM job_runs
WHERE status IN ('succeeded', 'dead', 'cancelled')
GROUP BY job_type, status;

-- As every function jobrunner installs (see 0007): names resolve in its own schema,
-- then pg_temp, last, whatever the search_path of the session that fires it. The pinning
-- is a function of its own from here on, so each later migration that installs a function
-- ends with one call instead of a copy of the loop. (0007 stays as it shipped: a database
-- that applied it never runs it again.)
CREATE OR REPLACE FUNCTION jobrunner_pin_search_paths() RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    fn regprocedure;
    home name;
BEGIN
    FOR fn, home IN
        SELECT p.oid::regprocedure, n.nspname
          FROM pg_proc p
          JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE p.proname LIKE 'jobrunner\_%'
           AND n.nspname = current_schema()
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', fn, home);
    END LOOP;
END
$$;
REVOKE ALL ON FUNCTION jobrunner_pin_search_paths() FROM PUBLIC;

SELECT jobrunner_pin_search_paths();
