-- A batch's members finishing in one statement call jobrunner_batch_member_finished once for
-- their batch, not once each (README "Batches and dependencies", bench/batches.py): the
-- trigger's function (migration 0026) runs after the statement, and all but one of those
-- calls found the batch's mark and returned, at about 5 µs each, most of what a batch cost a
-- drain.
--
-- The trigger's WHEN, evaluated for each row as the statement updates it, queues the call
-- for the first finished member of a batch it meets and notes that batch
-- (jobrunner.batch_queued, transaction-local): the next rows of that batch are skipped while
-- the note stands. The call, made after every row of the statement was updated, sees all
-- their finishes, as any of theirs would have; it clears the note first, so a later
-- statement (or one nested in a trigger, which fires its own calls at its own end) queues
-- its own. A note another batch replaced only queues a call more, which finds the mark.
-- The finish of the member the mark names (the guard) is always queued: it probes again.
-- A statement rolled back (a savepoint) takes its note with it, as it does its calls.
CREATE OR REPLACE FUNCTION jobrunner_batch_member_finished() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    unfinished text;
    guard bigint;
    mark text := current_setting('jobrunner.batch_guard', true);
BEGIN
    PERFORM set_config('jobrunner.batch_queued', '', true);
    IF split_part(mark, ':', 1) = NEW.batch_id::text
       AND split_part(mark, ':', 2) <> NEW.id::text THEN
        RETURN NULL;
    END IF;
    FOREACH unfinished IN ARRAY ARRAY['queued', 'running', 'failed', 'waiting'] LOOP
        SELECT id INTO guard FROM job_runs
        WHERE batch_id = NEW.batch_id AND status = unfinished
        ORDER BY -id LIMIT 1 FOR SHARE SKIP LOCKED;
        IF FOUND THEN
            PERFORM set_config('jobrunner.batch_guard', NEW.batch_id || ':' || guard, true);
            RETURN NULL;
        END IF;
    END LOOP;
    PERFORM jobrunner_batch_end(NEW.batch_id, coalesce(NEW.finished_at, NEW.updated_at), false);
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION jobrunner_batch_member_finished() FROM PUBLIC;

-- A CASE, as it evaluates its branches in order and only as far as needed: the note is
-- written only for a row whose call is queued (a claim, in the statement that finalizes
-- others, must not note its batch).
DROP TRIGGER job_runs_batch_member_finished ON job_runs;
CREATE TRIGGER job_runs_batch_member_finished
    AFTER UPDATE OF status ON job_runs
    FOR EACH ROW
    WHEN (CASE
              WHEN NEW.batch_id IS NULL OR NEW.status NOT IN ('succeeded', 'dead', 'cancelled')
                   OR OLD.status IN ('succeeded', 'dead', 'cancelled') THEN false
              WHEN split_part(current_setting('jobrunner.batch_guard', true), ':', 2)
                   = NEW.id::text THEN true
              WHEN current_setting('jobrunner.batch_queued', true) = NEW.batch_id::text
                   THEN false
              ELSE set_config('jobrunner.batch_queued', NEW.batch_id::text, true) IS NOT NULL
          END)
    EXECUTE FUNCTION jobrunner_batch_member_finished();

SELECT jobrunner_pin_search_paths();
