-- Batches (docs/guides/batches.md): runs enqueued together with a callback run
-- that is enqueued exactly once, in the transaction that finishes the batch's last member.

CREATE TABLE job_batches (
    id               bigserial PRIMARY KEY,
    -- 'finished': the callback runs once every member has ended, however; 'succeeded': only
    -- if every member succeeded (else `reason` says why, and a member retried into success
    -- later fires it then).
    on_outcome       text NOT NULL DEFAULT 'finished'
                     CHECK (on_outcome IN ('finished', 'succeeded')),
    then_type        text NOT NULL,
    then_payload     jsonb NOT NULL DEFAULT '{}',
    then_tenant_id   text,
    then_priority    integer NOT NULL DEFAULT 0,
    then_max_attempts integer,
    -- A schedule's occurrence whose tenant runs form the batch (`schedule add --then`).
    definition_id    bigint,
    scheduled_for    timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    -- The first time every member had ended; what they were when the callback was enqueued
    -- (or, without one, when they last all ended): counts by status and the first members
    -- (by id) that did not succeed. A member retried later changes its run, not these.
    ended_at         timestamptz,
    counts           jsonb,
    not_succeeded    bigint[],
    reason           text,
    callback_run_id  bigint UNIQUE
);

-- A tenant-scoped schedule whose occurrences' tenant runs each form a batch that calls back a
-- run of this type (`schedule add --then`).
ALTER TABLE job_definitions ADD COLUMN then_type text;

-- One batch per occurrence of a schedule: materializing is idempotent, and so is this.
CREATE UNIQUE INDEX job_batches_occurrence ON job_batches (definition_id, scheduled_for)
    WHERE definition_id IS NOT NULL;
-- `jobrunner batches` lists the newest first; pruning finds the ended ones.
CREATE INDEX job_batches_ended ON job_batches (ended_at) WHERE ended_at IS NOT NULL;

-- The batch a run belongs to. No foreign key: its check would cost every member's insert a
-- lookup of the batch; the batch outlives its members (pruning removes it after them).
ALTER TABLE job_runs ADD COLUMN batch_id bigint;

-- A batch's members by status: its progress (counts), and an unfinished member, found from
-- the highest id of a status down (jobrunner_batch_end). Claims take the lowest ids first, so
-- the highest queued member is unclaimed until the batch's last claim: the probe finds one
-- at once, not after the entries of the members that have moved on, whatever the batch's
-- size. Ordered by -id, not id: no other index gives that order, so no plan walks the
-- primary key down from the newest run, as one may for ORDER BY id DESC when the statistics
-- say that most runs are the batch's (taken while a large batch waited).
CREATE INDEX job_runs_batch ON job_runs (batch_id, status, (-id)) WHERE batch_id IS NOT NULL;

-- Ends batch `batch` if every member has ended: enqueues its callback (due at `at`, the last
-- member's finish) and records the counts, or, with on_outcome 'succeeded' and a member that
-- did not succeed, records why not. Returns the callback's id, or NULL.
--
-- No row is written by a member's finish unless it is the last: members' finalizes on
-- different ticks never wait for one another on a shared row. Whether this finish is the
-- last is decided in two steps, each a new snapshot (READ COMMITTED: the tick's connections
-- and ctx.db run in it).
--   1. The probe: an unfinished member that no other transaction is writing (FOR SHARE
--      SKIP LOCKED; a finalize in flight holds its row's lock until it commits). If there
--      is one, this finish is not the last, and the share lock makes that member's own
--      finish wait for this transaction's commit, so that finish sees this one. Nothing to
--      do.
--   2. Otherwise every unfinished member, if any, is being written by a transaction still
--      open, which may not see this one's finish, nor this one theirs. Those transactions
--      take turns on an advisory lock keyed by the batch and ask again once it is theirs:
--      the last of them sees every other committed. The update of the batch's row (WHERE
--      callback_run_id IS NULL) makes a second callback impossible even so.
-- `probe` false skips step 1: the caller (the trigger below) has just asked it.
CREATE FUNCTION jobrunner_batch_end(batch bigint, at timestamptz, probe boolean DEFAULT true)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    b job_batches;
    unfinished text;
    tallied jsonb;
    failed bigint[];
    missing bigint;
    callback bigint;
BEGIN
    FOREACH unfinished IN ARRAY ARRAY['queued', 'running', 'failed', 'waiting'] LOOP
        EXIT WHEN NOT probe;  -- the trigger below probed already
        PERFORM 1 FROM job_runs
        WHERE batch_id = batch AND status = unfinished
        ORDER BY -id LIMIT 1 FOR SHARE SKIP LOCKED;
        IF FOUND THEN
            RETURN NULL;
        END IF;
    END LOOP;
    PERFORM pg_advisory_xact_lock(hashtext('jobrunner.batch'), hashint8(batch));
    -- Asked again, status by status as the probe asks: on the batch's index whatever the
    -- statistics say, unlocked.
    FOREACH unfinished IN ARRAY ARRAY['queued', 'running', 'failed', 'waiting'] LOOP
        PERFORM 1 FROM job_runs WHERE batch_id = batch AND status = unfinished
        ORDER BY -id LIMIT 1;
        IF FOUND THEN
            RETURN NULL;
        END IF;
    END LOOP;
    SELECT * INTO b FROM job_batches WHERE id = batch FOR UPDATE;
    IF NOT FOUND OR b.callback_run_id IS NOT NULL THEN
        RETURN NULL;
    END IF;
    SELECT coalesce(jsonb_object_agg(status, n), '{}'), coalesce(sum(n) FILTER (
               WHERE status <> 'succeeded'), 0)
    INTO tallied, missing
    FROM (SELECT status, count(*) AS n FROM job_runs WHERE batch_id = batch GROUP BY status) s;
    failed := ARRAY(SELECT id FROM job_runs WHERE batch_id = batch AND status <> 'succeeded'
                    ORDER BY id LIMIT 100);
    IF b.on_outcome = 'succeeded' AND missing > 0 THEN
        UPDATE job_batches
        SET ended_at = coalesce(ended_at, at), counts = tallied, not_succeeded = failed,
            reason = format('no callback: %s member(s) did not succeed (%s)', missing,
                            (SELECT string_agg(key || ' ' || value, ', ' ORDER BY key)
                             FROM jsonb_each_text(tallied) WHERE key <> 'succeeded'))
        WHERE id = batch;
        RETURN NULL;
    END IF;
    INSERT INTO job_runs (job_type, payload, tenant_id, priority, max_attempts, run_at,
                          scheduled_for)
    VALUES (b.then_type, b.then_payload, b.then_tenant_id, b.then_priority,
            b.then_max_attempts, least(at, now()), b.scheduled_for)
    RETURNING id INTO callback;
    -- The counts the callback sees are the members' as they are now: for a callback after a
    -- retry (on_outcome 'succeeded'), not those of the first end.
    UPDATE job_batches
    SET ended_at = coalesce(ended_at, at), callback_run_id = callback, reason = NULL,
        counts = tallied, not_succeeded = failed
    WHERE id = batch;
    RETURN callback;
END
$$;
REVOKE ALL ON FUNCTION jobrunner_batch_end(bigint, timestamptz, boolean) FROM PUBLIC;

-- A member's finish asks the probe of jobrunner_batch_end here, in the trigger's own call:
-- most finishes are not the last, and pay one function call, not two. And once per
-- transaction and batch: the member the probe share-locked (the guard) stays unfinished and
-- locked until this transaction ends (no other can finish it), so its own finish, whenever
-- it comes, sees every finish of this transaction: the batch's later finishes here skip the
-- probe, but for the guard's, which probes again. The mark is transaction-local, and goes
-- with a savepoint rolled back, as the lock does.
--
-- And once per statement and batch (bench/batches.py: a call that finds the mark and returns
-- still cost about 5 µs a member, most of what a batch cost a drain). The trigger's WHEN,
-- evaluated for each row as the statement updates it, queues the call for the first
-- finished member of a batch it meets and notes that batch (jobrunner.batch_queued,
-- transaction-local): the next rows of that batch are skipped while the note stands. The
-- call, made after every row of the statement was updated, sees all their finishes, as any
-- of theirs would have; it clears the note first, so a later statement (or one nested in a
-- trigger, which fires its own calls at its own end) queues its own. A note another batch
-- replaced only queues a call more, which finds the mark. The finish of the member the mark
-- names (the guard) is always queued: it probes again. A statement rolled back (a
-- savepoint) takes its note with it, as it does its calls.
CREATE FUNCTION jobrunner_batch_member_finished() RETURNS trigger
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

-- Only a member's finish pays for the function; every other update of job_runs (claims,
-- heartbeats, runs of no batch) pays the WHEN test alone. A member retried after its batch
-- ended finishes again here, and finds the callback already there. A CASE, as it evaluates
-- its branches in order and only as far as needed: the note is written only for a row whose
-- call is queued (a claim, in the statement that finalizes others, must not note its batch).
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

-- Dependencies (docs/guides/batches.md): a run that waits for others. Until every
-- run it waits for has succeeded it is 'waiting', a status no claim looks at (the claim's
-- index holds 'queued' and 'failed' alone), so a thousand waiting runs cost a claim nothing.
-- The finish of the last of them makes it 'queued' and due, in the transaction of that
-- finish; a parent dead or cancelled cancels it, with a reason naming that parent, unless it
-- runs after its parents however they ended (policy 'finished').
ALTER TABLE job_runs DROP CONSTRAINT job_runs_status_check;
ALTER TABLE job_runs ADD CONSTRAINT job_runs_status_check
    CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'dead', 'cancelled',
                      'waiting')) NOT VALID;
ALTER TABLE job_runs VALIDATE CONSTRAINT job_runs_status_check;

-- Set on a run that others wait for, when the first of them is enqueued: the trigger below
-- runs for its finish alone. A constant default: no rewrite of the table.
ALTER TABLE job_runs ADD COLUMN has_dependents boolean NOT NULL DEFAULT false;

CREATE TABLE job_run_dependencies (
    parent_id  bigint NOT NULL REFERENCES job_runs (id) ON DELETE CASCADE,
    run_id     bigint NOT NULL REFERENCES job_runs (id) ON DELETE CASCADE,
    -- 'succeeded': the run starts once every parent succeeded, and is cancelled if one is
    -- dead or cancelled; 'finished': it starts once every parent has ended, however.
    policy     text NOT NULL DEFAULT 'succeeded' CHECK (policy IN ('succeeded', 'finished')),
    PRIMARY KEY (parent_id, run_id)
);
CREATE INDEX job_run_dependencies_run ON job_run_dependencies (run_id);
-- `status` and `metrics` count the waiting runs as they count the runnable ones, through an
-- index of them alone, whatever the history holds.
CREATE INDEX job_runs_waiting ON job_runs (job_type) WHERE status = 'waiting';

-- The ids among `ids` that name no run: an enqueue refuses them before it writes anything.
-- As the owner: the enqueuer reads nothing of job_runs, and learns here only whether an id
-- it names exists.
CREATE FUNCTION jobrunner_runs_unknown(ids bigint[]) RETURNS bigint[]
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT coalesce(array_agg(DISTINCT i ORDER BY i), '{}')
    FROM unnest(ids) AS i
    WHERE NOT EXISTS (SELECT 1 FROM job_runs r WHERE r.id = i)
$$;
REVOKE ALL ON FUNCTION jobrunner_runs_unknown(bigint[]) FROM PUBLIC;

-- Decides a waiting run `child` once one of its parents ended at `at`: cancelled, due, or
-- still waiting. Its row is locked first: two parents ending at once on two ticks take turns
-- on it, and the second reads the parents (a statement of its own, a new snapshot) once the
-- first has committed, so the last of them always sees every other ended.
CREATE FUNCTION jobrunner_run_decide_waiting(child bigint, at timestamptz) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    current text;
    blocking record;
    open_parents bigint;
BEGIN
    SELECT status INTO current FROM job_runs WHERE id = child FOR UPDATE;
    IF current IS DISTINCT FROM 'waiting' THEN
        RETURN;
    END IF;
    SELECT p.id, p.status INTO blocking
    FROM job_run_dependencies d JOIN job_runs p ON p.id = d.parent_id
    WHERE d.run_id = child AND d.policy = 'succeeded' AND p.status IN ('dead', 'cancelled')
    ORDER BY p.id LIMIT 1;
    IF FOUND THEN
        UPDATE job_runs
        SET status = 'cancelled', finished_at = at, updated_at = at,
            error_type = 'dependency_failed',
            last_error = format('cancelled: run %s, which it waits for, is %s',
                                blocking.id, blocking.status)
        WHERE id = child;
        RETURN;
    END IF;
    SELECT count(*) INTO open_parents
    FROM job_run_dependencies d JOIN job_runs p ON p.id = d.parent_id
    WHERE d.run_id = child
      AND p.status NOT IN ('succeeded', 'dead', 'cancelled');
    IF open_parents = 0 THEN
        UPDATE job_runs SET status = 'queued', run_at = greatest(run_at, at), updated_at = at
        WHERE id = child;
    END IF;
END
$$;
REVOKE ALL ON FUNCTION jobrunner_run_decide_waiting(bigint, timestamptz) FROM PUBLIC;

-- Makes runs `runs[i]` (just inserted by the caller's transaction) wait for `parents[i]`
-- under `policies[i]`, one edge per position. Each parent is marked (an update: it locks the
-- parent's row, so a parent finishing meanwhile is seen finished here, or sees the edges once
-- this commits), then each run is decided as a parent's finish would decide it: it may be due
-- or cancelled at once.
CREATE FUNCTION jobrunner_runs_wait(runs bigint[], parents bigint[], policies text[],
                                    at timestamptz) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    child bigint;
BEGIN
    INSERT INTO job_run_dependencies (parent_id, run_id, policy)
    SELECT p, r, pol FROM unnest(parents, runs, policies) AS e(p, r, pol)
    ON CONFLICT DO NOTHING;
    PERFORM 1 FROM (
        SELECT id FROM job_runs WHERE id = ANY(parents) ORDER BY id FOR NO KEY UPDATE
    ) locked;
    UPDATE job_runs SET has_dependents = true WHERE id = ANY(parents) AND NOT has_dependents;
    UPDATE job_runs SET status = 'waiting'
    WHERE id = ANY(runs) AND status = 'queued' AND attempts = 0;
    FOR child IN SELECT DISTINCT r FROM unnest(runs) AS r ORDER BY r LOOP
        PERFORM jobrunner_run_decide_waiting(child, at);
    END LOOP;
END
$$;
REVOKE ALL ON FUNCTION jobrunner_runs_wait(bigint[], bigint[], text[], timestamptz) FROM PUBLIC;

CREATE FUNCTION jobrunner_parent_finished() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    child bigint;
BEGIN
    FOR child IN SELECT run_id FROM job_run_dependencies WHERE parent_id = NEW.id ORDER BY run_id
    LOOP
        PERFORM jobrunner_run_decide_waiting(child, coalesce(NEW.finished_at, NEW.updated_at));
    END LOOP;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION jobrunner_parent_finished() FROM PUBLIC;

-- Only the finish of a run that others wait for pays for the function.
CREATE TRIGGER job_runs_parent_finished
    AFTER UPDATE OF status ON job_runs
    FOR EACH ROW
    WHEN (NEW.has_dependents AND NEW.status IN ('succeeded', 'dead', 'cancelled')
          AND OLD.status NOT IN ('succeeded', 'dead', 'cancelled'))
    EXECUTE FUNCTION jobrunner_parent_finished();

-- What each role may do on the batches' table and column, the table of dependencies, and the
-- functions that end a batch and make a run wait (docs/guides/roles.md): jobrunner_role_grants()
-- and jobrunner_grant_roles() (migration 0024) name them, and the roles of deploy/roles.sql
-- that exist get exactly that now.

SELECT jobrunner_pin_search_paths();
SELECT jobrunner_grant_roles();
