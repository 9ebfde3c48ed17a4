-- A run log belongs to an attempt its run made: the finalize that records the attempt's
-- outcome writes it, in the same statement, for an attempt the claim counted. A row for a
-- run that does not exist, or for an attempt it never made, is refused: the worker may
-- insert run logs, and could otherwise put words in the mouth of any run's attempt to come.
CREATE FUNCTION jobrunner_run_log_attempt_made() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM job_runs r
                   WHERE r.id = NEW.run_id AND NEW.attempt BETWEEN 1 AND r.attempts) THEN
        RAISE EXCEPTION 'run % made no attempt %: a run log is kept only for an attempt made',
            NEW.run_id, NEW.attempt USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER job_run_logs_attempt_made BEFORE INSERT ON job_run_logs
    FOR EACH ROW EXECUTE FUNCTION jobrunner_run_log_attempt_made();

-- As every function jobrunner installs (see 0007, 0010): names resolve in its own schema,
-- then pg_temp, last, whatever the search_path of the session that fires it.
SELECT jobrunner_pin_search_paths();
