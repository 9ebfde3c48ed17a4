-- Starting promptly (docs/guides/starting-promptly.md): `jobrunner tick --listen` sleeps on LISTEN
-- between runs, and what makes a run claimable wakes it with one NOTIFY per transaction.
--
-- PostgreSQL serializes the commits of every transaction that notifies (one lock for the
-- whole cluster, held through the commit's flush), so a notification is sent only when a
-- tick sleeps and could use it. Who sleeps is told by session-level advisory locks, which
-- cost no write and go with their session when it ends:
--
--   29958816149106292  held (shared) by every listening tick while it sleeps
--   29958816149106294  held (shared) by a sleeping tick with due runs held back by a limit,
--                      and by `jobrunner wait`: they want to hear of runs that finish
--
-- (The migrations' own locks are ...290 and ...291: cronjob/queries/preflight.py.) Each
-- trigger's WHEN tries the lock (exclusive, at once: it never waits, and lets go of it at
-- once) and fires only if it cannot have it: a statement with nobody asleep pays for the try
-- alone, and calls no function of ours. A transaction that found nobody asleep, and so sent
-- nothing, may still commit after a tick took its lock and claimed: the tick, once it holds
-- its lock, notes the transactions open, and claims again once they have ended
-- (queries.listen, TRANSACTIONS_OPEN). pg_notify sends a payload once per transaction however
-- often it is called: one notification per transaction, not one per run.

CREATE FUNCTION jobrunner_notify_sleepers() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('jobrunner', '');
    RETURN NULL;
END
$$;

-- Runs became claimable (an enqueue, a retry, a run handed back, a resumed type, a changed
-- limit, a schedule's next time moved): a tick sleeps. Once per statement: an insert of
-- 100,000 runs (a COPY too) tries the lock once.
CREATE TRIGGER job_runs_wake_ticks AFTER INSERT ON job_runs FOR EACH STATEMENT
    WHEN (CASE WHEN pg_try_advisory_lock(29958816149106292)
               THEN NOT pg_advisory_unlock(29958816149106292) ELSE true END)
    EXECUTE FUNCTION jobrunner_notify_sleepers();

-- A row that becomes waiting, or waits for an earlier time (retry, hand-back, a failed
-- attempt's backoff, rescue, a debounce's replacement). The columns are compared first, so
-- claims, heartbeats and successes pay nothing for it.
CREATE TRIGGER job_runs_wake_ticks_waiting AFTER UPDATE ON job_runs FOR EACH ROW
    WHEN (NEW.status IN ('queued', 'failed')
          AND (OLD.status NOT IN ('queued', 'failed') OR NEW.run_at < OLD.run_at)
          AND CASE WHEN pg_try_advisory_lock(29958816149106292)
                   THEN NOT pg_advisory_unlock(29958816149106292) ELSE true END)
    EXECUTE FUNCTION jobrunner_notify_sleepers();

-- Runs finished, ended an attempt, were retried or cancelled: every statement that does so
-- sets finished_at (finalize, rescue, retry, cancel); a heartbeat does not, and fires
-- nothing. Someone waits for that: a tick whose due runs a limit holds back, `wait`. A claim
-- sets it too (to NULL: its row must not keep the finish of a version an operator's retry
-- replaced meanwhile), so while someone waits it wakes them for nothing new: they look, find
-- their runs as they were, and wait on.
CREATE TRIGGER job_runs_note_finishes AFTER UPDATE OF finished_at ON job_runs FOR EACH STATEMENT
    WHEN (CASE WHEN pg_try_advisory_lock(29958816149106294)
               THEN NOT pg_advisory_unlock(29958816149106294) ELSE true END)
    EXECUTE FUNCTION jobrunner_notify_sleepers();

CREATE TRIGGER job_type_pauses_wake_ticks AFTER DELETE ON job_type_pauses FOR EACH STATEMENT
    WHEN (CASE WHEN pg_try_advisory_lock(29958816149106292)
               THEN NOT pg_advisory_unlock(29958816149106292) ELSE true END)
    EXECUTE FUNCTION jobrunner_notify_sleepers();
CREATE TRIGGER job_type_limits_wake_ticks AFTER INSERT OR UPDATE OR DELETE ON job_type_limits
    FOR EACH STATEMENT
    WHEN (CASE WHEN pg_try_advisory_lock(29958816149106292)
               THEN NOT pg_advisory_unlock(29958816149106292) ELSE true END)
    EXECUTE FUNCTION jobrunner_notify_sleepers();
-- A schedule added, resumed or moved: a sleeping tick wakes at its next fire time.
CREATE TRIGGER job_definitions_wake_ticks
    AFTER INSERT OR UPDATE OF next_fire_at, enabled ON job_definitions FOR EACH STATEMENT
    WHEN (CASE WHEN pg_try_advisory_lock(29958816149106292)
               THEN NOT pg_advisory_unlock(29958816149106292) ELSE true END)
    EXECUTE FUNCTION jobrunner_notify_sleepers();

-- A sleeping tick wakes at the earliest future run_at of the runs it could claim: the first
-- entry of this index after now. Waiting runs only, as job_runs_dispatch: a claim takes a run
-- out of it, so this costs an enqueue one entry and a claim nothing. Built inside the
-- migration's transaction, as 0021's indexes were: writes to job_runs wait while it is built.
CREATE INDEX job_runs_waiting_by_time ON job_runs (run_at) WHERE status IN ('queued', 'failed');

-- The ticks that stay (`tick --listen`), for status, metrics and the dashboard: one row
-- each while it runs, refreshed while it waits and deleted when it ends; a row not seen for
-- a few minutes (its tick was killed) is deleted by the next tick that starts.
CREATE TABLE job_ticks (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    host            text NOT NULL,
    pid             integer NOT NULL,
    started_at      timestamptz NOT NULL,
    -- Since when it listens; NULL while it polls (LISTEN cannot work through its connection).
    listening_since timestamptz,
    poll_interval   double precision CHECK (poll_interval > 0),
    last_seen       timestamptz NOT NULL,
    CONSTRAINT job_ticks_listens_or_polls
        CHECK ((listening_since IS NULL) = (poll_interval IS NOT NULL))
);

-- As every function jobrunner installs (see 0007, 0010): names resolve in its own schema,
-- then pg_temp, last, whatever the search_path of the session that fires it.
SELECT jobrunner_pin_search_paths();

-- The worker keeps its tick's row, the reader reads them (status, metrics, the dashboard):
-- jobrunner_role_grants() (migration 0024) lists the table, and the roles of
-- deploy/roles.sql that exist get exactly that now.
SELECT jobrunner_grant_roles();
