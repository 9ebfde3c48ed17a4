-- Batches (README "Batches and dependencies"): runs enqueued together with a callback run
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
CREATE FUNCTION jobrunner_batch_member_finished() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    unfinished text;
    guard bigint;
    mark text := current_setting('jobrunner.batch_guard', true);
BEGIN
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
-- ended finishes again here, and finds the callback already there.
CREATE TRIGGER job_runs_batch_member_finished
    AFTER UPDATE OF status ON job_runs
    FOR EACH ROW
    WHEN (NEW.batch_id IS NOT NULL AND NEW.status IN ('succeeded', 'dead', 'cancelled')
          AND OLD.status NOT IN ('succeeded', 'dead', 'cancelled'))
    EXECUTE FUNCTION jobrunner_batch_member_finished();

-- Dependencies (README "Batches and dependencies"): a run that waits for others. Until every
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

-- What each role may do, as 0024 lists it, with the batch's table and column, the table of
-- dependencies, and the functions that end a batch and make a run wait (README "Roles").
CREATE OR REPLACE FUNCTION jobrunner_role_grants()
RETURNS TABLE (relname name, grantee name, privileges text, columns name[])
LANGUAGE sql IMMUTABLE AS $$
    VALUES
        ('jobrunner_migrations'::name, 'jobrunner_worker'::name, 'SELECT', NULL::name[]),
        ('jobrunner_migrations', 'jobrunner_enqueuer', 'SELECT', NULL),
        ('jobrunner_migrations', 'jobrunner_reader', 'SELECT', NULL),
        ('jobrunner_migrations', 'jobrunner_operator', 'SELECT', NULL),

        ('job_runs', 'jobrunner_worker', 'SELECT, INSERT, UPDATE, DELETE', NULL),
        -- The columns an enqueue writes (cronjob/run_options.py), by INSERT or COPY; not
        -- enqueued_by, which the database sets. It reads nothing back: the run that holds a
        -- key comes from jobrunner_runs_holding_keys.
        ('job_runs', 'jobrunner_enqueuer', 'INSERT',
         '{id, job_type, payload, run_at, idempotency_key, max_attempts, priority, tenant_id,'
         ' queue, result_id, run_after, traceparent, tracestate, unique_key, created_at,'
         ' updated_at, batch_id}'),
        ('job_runs', 'jobrunner_reader', 'SELECT', NULL),
        -- What retry, cancel and prune select runs by and change; no payload, no return value.
        ('job_runs', 'jobrunner_operator', 'SELECT',
         '{id, definition_id, job_type, tenant_id, scheduled_for, run_at, status, attempts,'
         ' max_attempts, priority, locked_by, locked_until, last_error, error_type, started_at,'
         ' finished_at, created_at, updated_at, batch_id}'),
        ('job_runs', 'jobrunner_operator', 'UPDATE',
         '{status, attempts, run_at, finished_at, locked_by, locked_until, lease_token,'
         ' updated_at}'),
        ('job_runs', 'jobrunner_operator', 'DELETE', NULL),

        ('job_attempts', 'jobrunner_worker', 'SELECT, INSERT', NULL),
        ('job_attempts', 'jobrunner_reader', 'SELECT', NULL),
        -- A retry records the attempt it takes from a running worker.
        ('job_attempts', 'jobrunner_operator', 'INSERT', NULL),

        ('job_definitions', 'jobrunner_worker', 'SELECT, UPDATE', NULL),
        ('job_definitions', 'jobrunner_reader', 'SELECT', NULL),
        ('job_definitions', 'jobrunner_operator', 'SELECT, INSERT, UPDATE, DELETE', NULL),

        -- Pruning locks the keys it deletes (FOR UPDATE needs an UPDATE grant on some column).
        ('job_effects', 'jobrunner_worker', 'SELECT, INSERT, UPDATE, DELETE', NULL),
        ('job_effects', 'jobrunner_operator', 'SELECT', '{key, run_id, created_at}'),
        ('job_effects', 'jobrunner_operator', 'UPDATE', '{created_at}'),
        ('job_effects', 'jobrunner_operator', 'DELETE', NULL),

        ('job_type_pauses', 'jobrunner_worker', 'SELECT', NULL),
        ('job_type_pauses', 'jobrunner_reader', 'SELECT', NULL),
        ('job_type_pauses', 'jobrunner_operator', 'SELECT, INSERT, DELETE', NULL),

        -- Every claim reads the limits, and times the starts of rate-limited keys.
        ('job_type_limits', 'jobrunner_worker', 'SELECT', NULL),
        ('job_type_limits', 'jobrunner_reader', 'SELECT', NULL),
        ('job_type_limits', 'jobrunner_operator', 'SELECT, INSERT, UPDATE, DELETE', NULL),
        ('job_rate_arrivals', 'jobrunner_worker', 'SELECT, INSERT, UPDATE', NULL),
        ('job_rate_arrivals', 'jobrunner_reader', 'SELECT', NULL),
        -- A limit set or cleared forgets the keys' next starts under the old one.
        ('job_rate_arrivals', 'jobrunner_operator', 'SELECT, DELETE', NULL),

        ('job_audit', 'jobrunner_reader', 'SELECT', NULL),
        ('job_audit', 'jobrunner_operator', 'INSERT', NULL),
        ('job_audit', 'jobrunner_operator', 'SELECT', '{id}'),
        ('job_audit_batches', 'jobrunner_reader', 'SELECT', NULL),
        ('job_audit_batches', 'jobrunner_operator', 'INSERT', NULL),

        ('job_run_tally', 'jobrunner_worker', 'SELECT, INSERT, DELETE', NULL),
        ('job_run_tally', 'jobrunner_reader', 'SELECT', NULL),

        ('job_schedule_skips', 'jobrunner_worker', 'SELECT, INSERT, DELETE', NULL),
        ('job_schedule_skips', 'jobrunner_reader', 'SELECT', NULL),

        ('job_schedule_health', 'jobrunner_worker', 'SELECT', NULL),
        ('job_schedule_health', 'jobrunner_reader', 'SELECT', NULL),

        -- A finalize writes each attempt's run log (for an attempt made: the trigger above),
        -- and the worker reads what a tick reads and show; pruning a run deletes its logs
        -- through the foreign key's cascade, which acts as the table's owner.
        ('job_run_logs', 'jobrunner_worker', 'SELECT, INSERT', NULL),
        ('job_run_logs', 'jobrunner_reader', 'SELECT', NULL),

        -- The job types a tick has handlers for (0025, if it is there): the tick records
        -- them, status reads them.
        ('job_handlers_seen', 'jobrunner_worker', 'SELECT, INSERT, UPDATE, DELETE', NULL),
        ('job_handlers_seen', 'jobrunner_reader', 'SELECT', NULL),

        -- A schedule's occurrence makes its batch as it materializes; a member's finish ends
        -- its batch through jobrunner_batch_end, as the owner. An enqueue writes a batch it
        -- draws the id of first (it reads nothing back); pruning removes the ended ones.
        ('job_batches', 'jobrunner_worker', 'SELECT, INSERT, DELETE', NULL),
        ('job_batches', 'jobrunner_enqueuer', 'INSERT',
         '{id, on_outcome, then_type, then_payload, then_tenant_id, then_priority,'
         ' then_max_attempts, created_at}'),
        ('job_batches', 'jobrunner_reader', 'SELECT', NULL),
        ('job_batches', 'jobrunner_operator', 'SELECT, DELETE', NULL),

        -- Written through jobrunner_runs_wait and the finish of a parent, as the owner;
        -- `show` and the dashboard read them.
        ('job_run_dependencies', 'jobrunner_worker', 'SELECT', NULL),
        ('job_run_dependencies', 'jobrunner_reader', 'SELECT', NULL),
        ('job_run_dependencies', 'jobrunner_operator', 'SELECT', NULL),

        -- Tables of later migrations, granted once they exist (each calls
        -- jobrunner_grant_roles() in the transaction that creates its table). The ticks that
        -- stay (0027): each keeps its row, and deletes the rows of ticks that were killed.
        ('job_ticks', 'jobrunner_worker', 'SELECT, INSERT, UPDATE, DELETE', NULL),
        ('job_ticks', 'jobrunner_reader', 'SELECT', NULL)
$$;

-- Gives the roles of roles.sql that exist exactly the grants of jobrunner_role_grants() on
-- the tables it names, and what they need of those tables' sequences and of the functions
-- only some roles may call: every privilege they hold on them is revoked first (what the
-- default privileges of roles.sql gave the worker on every new table, or an earlier version
-- of roles.sql), then these are granted. Called at the end of this migration and of every
-- later one that changes the list, and by roles.sql; as whoever calls it, the tables' owner.
-- A table it does not name keeps what default privileges gave.
CREATE OR REPLACE FUNCTION jobrunner_grant_roles() RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    roles name[] := ARRAY(
        SELECT r FROM unnest(ARRAY['jobrunner_worker', 'jobrunner_enqueuer', 'jobrunner_reader',
                                   'jobrunner_operator']::name[]) AS r
        WHERE to_regrole(r) IS NOT NULL);
    everyone text;
    statement text;
BEGIN
    IF cardinality(roles) = 0 THEN
        RETURN;
    END IF;
    everyone := (SELECT string_agg(quote_ident(r), ', ') FROM unnest(roles) AS r);
    FOR statement IN
        SELECT format('REVOKE ALL ON TABLE %I.%I FROM %s', n.nspname, c.relname, everyone)
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
          AND c.relname IN (SELECT g.relname FROM jobrunner_role_grants() g)
    LOOP
        EXECUTE statement;
    END LOOP;
    FOR statement IN
        SELECT format('GRANT %s%s ON TABLE %I.%I TO %I', g.privileges,
                      CASE WHEN g.columns IS NOT NULL THEN ' (' || present.columns || ')' END,
                      n.nspname, c.relname, g.grantee)
        FROM jobrunner_role_grants() g
        JOIN pg_class c ON c.relname = g.relname
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN LATERAL (
            SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) AS columns
            FROM pg_attribute a
            WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
              AND a.attname = ANY(g.columns)
        ) present ON true
        WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
          AND g.grantee = ANY(roles)
          AND (g.columns IS NULL OR present.columns IS NOT NULL)
    LOOP
        EXECUTE statement;
    END LOOP;

    -- The sequences of these tables' serial columns: the worker uses them all; the enqueuer
    -- draws run ids, the operator the ids of the schedules, attempts and audit entries it
    -- writes. (Identity columns need no grant.)
    FOR statement IN
        WITH sequences AS (
            SELECT n.nspname, s.relname
            FROM pg_class s
            JOIN pg_namespace n ON n.oid = s.relnamespace
            JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = s.oid
                            AND d.refclassid = 'pg_class'::regclass AND d.deptype = 'a'
            JOIN pg_class t ON t.oid = d.refobjid
            WHERE n.nspname = current_schema() AND s.relkind = 'S'
              AND t.relname IN (SELECT g.relname FROM jobrunner_role_grants() g)
        )
        SELECT format('REVOKE ALL ON SEQUENCE %I.%I FROM %s', nspname, relname, everyone)
        FROM sequences
        UNION ALL
        SELECT format('GRANT %s ON SEQUENCE %I.%I TO %I', u.privileges, q.nspname, q.relname,
                      u.grantee)
        FROM sequences q
        JOIN (VALUES (NULL, 'jobrunner_worker', 'USAGE, SELECT'),
                     ('job_runs_id_seq', 'jobrunner_enqueuer', 'USAGE'),
                     ('job_batches_id_seq', 'jobrunner_enqueuer', 'USAGE'),
                     ('job_attempts_id_seq', 'jobrunner_operator', 'USAGE'),
                     ('job_definitions_id_seq', 'jobrunner_operator', 'USAGE'),
                     ('job_audit_id_seq', 'jobrunner_operator', 'USAGE'))
            AS u(relname, grantee, privileges) ON coalesce(u.relname, q.relname) = q.relname
        WHERE u.grantee = ANY(roles)
    LOOP
        EXECUTE statement;
    END LOOP;

    -- Functions that act as the owner and that only the roles that enqueue may call: the
    -- read-back of the runs holding keys, a debounce's replacement of a waiting run, and the
    -- end of a batch that an enqueue finds over already (migration 0026).
    FOR statement IN
        SELECT format('GRANT EXECUTE ON FUNCTION %s TO %I', p.oid::regprocedure, f.grantee)
        FROM (VALUES ('jobrunner_runs_holding_keys', 'jobrunner_enqueuer'),
                     ('jobrunner_runs_holding_keys', 'jobrunner_worker'),
                     ('jobrunner_replace_waiting', 'jobrunner_enqueuer'),
                     ('jobrunner_replace_waiting', 'jobrunner_worker'),
                     ('jobrunner_batch_end', 'jobrunner_enqueuer'),
                     ('jobrunner_batch_end', 'jobrunner_worker'),
                     ('jobrunner_runs_unknown', 'jobrunner_enqueuer'),
                     ('jobrunner_runs_unknown', 'jobrunner_worker'),
                     ('jobrunner_runs_wait', 'jobrunner_enqueuer'),
                     ('jobrunner_runs_wait', 'jobrunner_worker')) AS f(proname, grantee)
        JOIN pg_proc p ON p.proname = f.proname
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = current_schema() AND f.grantee = ANY(roles)
    LOOP
        EXECUTE statement;
    END LOOP;
END
$$;
REVOKE ALL ON FUNCTION jobrunner_grant_roles() FROM PUBLIC;

SELECT jobrunner_pin_search_paths();
SELECT jobrunner_grant_roles();
