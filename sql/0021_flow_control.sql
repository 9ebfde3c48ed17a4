-- Flow control (README "Flow control"): claims fair across tenants; limits on how many runs
-- of a job type run at once or start per period, per type or per key; unique-while-active keys.

-- Dispatch, rebuilt: waiting runs by priority and then by tenant, so a claim reaches each
-- tenant's earliest runs without walking another tenant's backlog (runs without a tenant are
-- one more tenant, ''). Built inside the migration's transaction: writes to job_runs wait
-- while it is built (a read of the waiting runs only; see 0015 on large tables).
DROP INDEX job_runs_dispatch;
CREATE INDEX job_runs_dispatch ON job_runs (priority, (coalesce(tenant_id, '')), run_at, id)
    WHERE status IN ('queued', 'failed');

-- The waiting runs of one job type, tenant by tenant: what the claim of a type with a limit
-- walks (jobrunner_claim_limited), one probe per tenant, whatever the backlog of the others.
-- A claim that takes a run changes its status, so this index costs an enqueue one entry and a
-- claim nothing.
CREATE INDEX job_runs_waiting_by_type
    ON job_runs (job_type, (coalesce(tenant_id, '')), priority, run_at, id)
    WHERE status IN ('queued', 'failed');

-- The (priority, tenant) pairs that have waiting runs, each once, for a claim fair across
-- tenants (queries.runs, "the claim"): at most `most` of them, in four phases: (1) the
-- priorities before the cursor's, in order; (2) the cursor's priority, the tenants after the
-- cursor's; (3) that priority again, the tenants up to the cursor's; (4) the priorities after
-- it. So priority comes first, and within the cursor's priority the tenants take turns from
-- claim to claim. Each step is one probe of job_runs_dispatch positioned at its lower bound;
-- a phase's upper bound is checked on the pair found, not given to the scan, which before
-- PostgreSQL 18 would read on through every pair past it. A function, so that its few
-- statements are planned once a session rather than with every claim.
CREATE FUNCTION jobrunner_tenant_walk(cursor_priority integer, cursor_tenant text, most integer)
RETURNS TABLE (priority integer, tenant text, step integer)
LANGUAGE plpgsql STABLE ROWS 10 AS $$
#variable_conflict use_column
DECLARE
    p integer;
    t text;
    n integer := 0;
    phase integer;
BEGIN
    FOR phase IN 1..4 LOOP
        p := NULL;
        LOOP
            EXIT WHEN n >= most;
            IF p IS NOT NULL THEN
                SELECT r.priority, coalesce(r.tenant_id, '') INTO p, t FROM job_runs r
                WHERE r.status IN ('queued', 'failed')
                  AND (r.priority, coalesce(r.tenant_id, '')) > (p, t)
                ORDER BY r.priority, coalesce(r.tenant_id, '') LIMIT 1;
            ELSIF phase = 1 THEN
                SELECT r.priority, coalesce(r.tenant_id, '') INTO p, t FROM job_runs r
                WHERE r.status IN ('queued', 'failed')
                ORDER BY r.priority, coalesce(r.tenant_id, '') LIMIT 1;
            ELSIF phase = 2 THEN
                SELECT r.priority, coalesce(r.tenant_id, '') INTO p, t FROM job_runs r
                WHERE r.status IN ('queued', 'failed')
                  AND (r.priority, coalesce(r.tenant_id, '')) > (cursor_priority, cursor_tenant)
                ORDER BY r.priority, coalesce(r.tenant_id, '') LIMIT 1;
            ELSIF phase = 3 THEN
                SELECT r.priority, coalesce(r.tenant_id, '') INTO p, t FROM job_runs r
                WHERE r.status IN ('queued', 'failed') AND r.priority >= cursor_priority
                ORDER BY r.priority, coalesce(r.tenant_id, '') LIMIT 1;
            ELSE
                SELECT r.priority, coalesce(r.tenant_id, '') INTO p, t FROM job_runs r
                WHERE r.status IN ('queued', 'failed') AND r.priority > cursor_priority
                ORDER BY r.priority, coalesce(r.tenant_id, '') LIMIT 1;
            END IF;
            EXIT WHEN NOT FOUND
                OR (phase = 1 AND p >= cursor_priority)
                OR (phase = 2 AND p <> cursor_priority)
                OR (phase = 3 AND (p <> cursor_priority OR t > cursor_tenant));
            n := n + 1;
            priority := p;
            tenant := t;
            step := n;
            RETURN NEXT;
        END LOOP;
    END LOOP;
END
$$;

-- The ids of the runs of types without a limit (`types`: the tick's, less the paused and the
-- limited ones) that a claim may take now, at most `wanted`, locked, in the order they are
-- handed to the workers: fair across tenants (queries.runs, "the claim"). The first `wanted`
-- (priority, tenant) pairs from the cursor on (jobrunner_tenant_walk) each get an equal share
-- of `wanted` among the pairs of their priority, their earliest due runs first; the runs go
-- by priority, then turn by turn, tenant after tenant in the walk's order. When the tenants
-- walked have fewer due runs than that, more are taken in dispatch order, so that a claim is
-- not cut short by tenants with little to do. A function, so that its statements are planned
-- once a session rather than with every claim.
CREATE FUNCTION jobrunner_claimable_fair(types text[], wanted integer, cursor_priority integer,
                                         cursor_tenant text, now timestamptz)
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    walked record;
    got bigint[];
    ids bigint[] := '{}';
    priorities integer[] := '{}';
    turns integer[] := '{}';
    steps integer[] := '{}';
    handed bigint[];
BEGIN
    IF wanted <= 0 OR cardinality(types) = 0 THEN
        RETURN '{}';
    END IF;
    FOR walked IN
        SELECT w.priority, w.tenant, w.step, count(*) OVER (PARTITION BY w.priority) AS peers
        FROM jobrunner_tenant_walk(cursor_priority, cursor_tenant, wanted) w
    LOOP
        got := ARRAY(
            SELECT r.id FROM job_runs r
            WHERE r.status IN ('queued', 'failed') AND r.priority = walked.priority
              AND coalesce(r.tenant_id, '') = walked.tenant AND r.run_at <= now
              AND r.job_type = ANY(types)
              AND (NOT r.exclusive OR jobrunner_exclusive_run_is_next(r))
            ORDER BY r.run_at, r.id
            LIMIT ceil(wanted::numeric / walked.peers)
            FOR UPDATE SKIP LOCKED);
        ids := ids || got;
        priorities := priorities || array_fill(walked.priority, ARRAY[cardinality(got)]);
        turns := turns || ARRAY(SELECT generate_series(1, cardinality(got)));
        steps := steps || array_fill(walked.step, ARRAY[cardinality(got)]);
    END LOOP;
    handed := ARRAY(
        SELECT u.id FROM unnest(ids, priorities, turns, steps) AS u(id, priority, turn, step)
        ORDER BY u.priority, u.turn, u.step
        LIMIT wanted);
    IF cardinality(handed) < wanted THEN
        -- Runs this claim locked and left (a share rounded up) are its own: SKIP LOCKED would
        -- not skip them.
        handed := handed || ARRAY(
            SELECT r.id FROM job_runs r
            WHERE r.status IN ('queued', 'failed') AND r.run_at <= now
              AND r.job_type = ANY(types) AND r.id <> ALL(ids)
              AND (NOT r.exclusive OR jobrunner_exclusive_run_is_next(r))
            ORDER BY r.priority, coalesce(r.tenant_id, ''), r.run_at, r.id
            LIMIT wanted - cardinality(handed)
            FOR UPDATE SKIP LOCKED);
    END IF;
    RETURN handed;
END
$$;

-- A limit is one row per job type, set by `jobrunner limit`, a schedule file or Django's
-- settings. A claim reads it (a handful of rows) as it reads job_type_pauses.
CREATE TABLE job_type_limits (
    job_type     text PRIMARY KEY,
    concurrency  integer CHECK (concurrency >= 1),        -- at most this many running at once
    rate         integer CHECK (rate >= 1),                -- at most this many starts ...
    rate_period  double precision CHECK (rate_period > 0), -- ... per this many seconds
    per          text NOT NULL DEFAULT 'type' CHECK (per IN ('type', 'tenant', 'payload')),
    per_field    text,                                     -- the payload field, per = 'payload'
    reason       text,
    set_by       text NOT NULL,
    set_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT job_type_limits_something CHECK (concurrency IS NOT NULL OR rate IS NOT NULL),
    CONSTRAINT job_type_limits_rate_whole CHECK ((rate IS NULL) = (rate_period IS NULL)),
    CONSTRAINT job_type_limits_field_iff_payload CHECK ((per = 'payload') = (per_field IS NOT NULL))
);

-- Rate limits count starts in fixed windows aligned to the epoch: one row per key, its current
-- window and the starts counted in it, written by claims holding the key's lock.
CREATE TABLE job_rate_windows (
    job_type      text NOT NULL,
    limit_key     text NOT NULL,
    window_start  timestamptz NOT NULL,
    starts        integer NOT NULL CHECK (starts >= 0),
    PRIMARY KEY (job_type, limit_key)
);

-- A run's key under its type's limit: '' for a limit on the whole type.
CREATE FUNCTION jobrunner_limit_key(per text, per_field text, tenant text, payload jsonb)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE per WHEN 'tenant' THEN coalesce(tenant, '')
                    WHEN 'payload' THEN coalesce(payload ->> per_field, '')
                    ELSE '' END
$$;

-- How many more runs of a key may start now, under its type's limit, and the key's lock: a
-- transaction-scoped advisory lock per (type, key), held until the claim commits. Taken with
-- try: a key another claim is taking from right now is left to it (as SKIP LOCKED leaves a
-- row), and no two claims ever wait on each other. Counted after the lock is held, each count
-- a statement of its own and so a snapshot taken after the previous holder committed: every
-- run that holder claimed is counted. A running run whose lease expired holds no place: its
-- tick crashed, and rescue makes it due again.
CREATE FUNCTION jobrunner_limit_room(lim job_type_limits, key text, now timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    room integer := 2147483647;
    used integer;
    current_window timestamptz;
BEGIN
    IF NOT pg_try_advisory_xact_lock(
            hashtextextended('jobrunner.limit' || chr(31) || lim.job_type || chr(31) || key, 0))
    THEN
        RETURN 0;
    END IF;
    IF lim.concurrency IS NOT NULL THEN
        SELECT count(*) INTO used FROM job_runs r
        WHERE r.status = 'running' AND r.locked_until >= now AND r.job_type = lim.job_type
          AND jobrunner_limit_key(lim.per, lim.per_field, r.tenant_id, r.payload) = key;
        room := lim.concurrency - used;
    END IF;
    IF lim.rate IS NOT NULL THEN
        current_window := to_timestamp(
            floor(extract(epoch FROM now) / lim.rate_period) * lim.rate_period);
        SELECT w.starts INTO used FROM job_rate_windows w
        WHERE w.job_type = lim.job_type AND w.limit_key = key AND w.window_start = current_window;
        room := least(room, lim.rate - coalesce(used, 0));
    END IF;
    RETURN greatest(room, 0);
END
$$;

-- Counts `starts` more starts of a key in the current window of its type's rate limit.
CREATE FUNCTION jobrunner_rate_count(lim job_type_limits, key text, starts integer,
                                     now timestamptz)
RETURNS void
LANGUAGE sql VOLATILE AS $$
    INSERT INTO job_rate_windows AS w (job_type, limit_key, window_start, starts)
    VALUES (lim.job_type, key,
            to_timestamp(floor(extract(epoch FROM now) / lim.rate_period) * lim.rate_period),
            starts)
    ON CONFLICT (job_type, limit_key) DO UPDATE
    SET starts = CASE WHEN w.window_start = excluded.window_start
                      THEN w.starts + excluded.starts ELSE excluded.starts END,
        window_start = excluded.window_start
$$;

-- Whether an exclusive run (a run of a schedule whose overlap policy is 'skip' or 'queue',
-- 0011) may start: nothing else of its schedule and tenant is running, and no older run of
-- them is waiting. The claim of a limited type asks it as the claim asks it of other runs
-- (queries.runs._EXCLUSIVE_RUN_IS_NEXT).
CREATE FUNCTION jobrunner_exclusive_run_is_next(run job_runs)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT NOT EXISTS (
        SELECT 1 FROM job_runs o
        WHERE o.exclusive AND o.definition_id = run.definition_id
          AND coalesce(o.tenant_id, '') = coalesce(run.tenant_id, '')
          AND o.status IN ('queued', 'running', 'failed') AND o.id <> run.id
          AND (o.status = 'running' OR o.id < run.id))
$$;

-- The ids of the runs of a limited type the claim may take now, at most `wanted`, locked:
-- the type's waiting runs are walked tenant by tenant (job_runs_waiting_by_type, one probe
-- each), from the tenant after `start` (the tenant the previous claim handed over last, so
-- that tenants take turns) round to it, each run taken while its key has room. Due runs only, an exclusive run only when it
-- is next. A key's room is asked once, when the walk first meets it, with its lock. Under a
-- limit per type or per tenant, a tenant's runs share one key, and as many as its room allows
-- are taken at once; a per-payload key is read from each run, so the walk reads at most
-- `scan` runs of a type to find keys with room.
CREATE FUNCTION jobrunner_limited_run_ids(lim job_type_limits, wanted integer, scan integer,
                                          now timestamptz, start text)
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    tenant text := start;
    found_tenant text;
    wrapped boolean := start IS NULL;
    key text;
    rooms jsonb := '{}';
    room integer;
    taken bigint[] := '{}';
    got bigint[];
    run record;
    starts jsonb := '{}';
BEGIN
    WHILE cardinality(taken) < wanted AND scan > 0 LOOP
        -- Two statements, not one with `tenant IS NULL OR`: each positioned by its bound.
        IF tenant IS NULL THEN
            SELECT coalesce(r.tenant_id, '') INTO found_tenant FROM job_runs r
            WHERE r.status IN ('queued', 'failed') AND r.job_type = lim.job_type
            ORDER BY coalesce(r.tenant_id, '') LIMIT 1;
        ELSE
            SELECT coalesce(r.tenant_id, '') INTO found_tenant FROM job_runs r
            WHERE r.status IN ('queued', 'failed') AND r.job_type = lim.job_type
              AND coalesce(r.tenant_id, '') > tenant
            ORDER BY coalesce(r.tenant_id, '') LIMIT 1;
        END IF;
        -- From the tenant after `start` to the last, then from the first up to `start`.
        IF NOT FOUND OR (wrapped AND start IS NOT NULL AND found_tenant > start) THEN
            EXIT WHEN wrapped;
            wrapped := true;
            tenant := NULL;
            CONTINUE;
        END IF;
        tenant := found_tenant;
        IF lim.per <> 'payload' THEN
            -- One key for the whole tenant: its room, and that many of its runs at once.
            key := CASE lim.per WHEN 'tenant' THEN tenant ELSE '' END;
            IF NOT rooms ? key THEN
                rooms := rooms || jsonb_build_object(key, jobrunner_limit_room(lim, key, now));
            END IF;
            room := least((rooms ->> key)::integer, wanted - cardinality(taken));
            CONTINUE WHEN room <= 0 AND lim.per = 'tenant';
            EXIT WHEN room <= 0;
            got := ARRAY(
                SELECT r.id FROM job_runs r
                WHERE r.status IN ('queued', 'failed') AND r.job_type = lim.job_type
                  AND coalesce(r.tenant_id, '') = tenant AND r.run_at <= now
                  AND (NOT r.exclusive OR jobrunner_exclusive_run_is_next(r))
                ORDER BY r.priority, r.run_at, r.id
                LIMIT room
                FOR UPDATE SKIP LOCKED);
            scan := scan - cardinality(got);
        ELSE
            -- A key per run: read from each run, its room asked the first time it is met.
            got := '{}';
            FOR run IN
                SELECT r.id, r.tenant_id, r.payload FROM job_runs r
                WHERE r.status IN ('queued', 'failed') AND r.job_type = lim.job_type
                  AND coalesce(r.tenant_id, '') = tenant AND r.run_at <= now
                  AND (NOT r.exclusive OR jobrunner_exclusive_run_is_next(r))
                ORDER BY r.priority, r.run_at, r.id
                LIMIT scan
            LOOP
                scan := scan - 1;
                key := coalesce(run.payload ->> lim.per_field, '');
                IF NOT rooms ? key THEN
                    rooms := rooms || jsonb_build_object(key, jobrunner_limit_room(lim, key, now));
                END IF;
                IF (rooms ->> key)::integer > 0 AND EXISTS (
                        SELECT 1 FROM job_runs r
                        WHERE r.id = run.id AND r.status IN ('queued', 'failed')
                        FOR UPDATE SKIP LOCKED) THEN
                    got := got || run.id;
                    rooms := rooms || jsonb_build_object(key, (rooms ->> key)::integer - 1);
                    starts := starts || jsonb_build_object(
                        key, coalesce((starts ->> key)::integer, 0) + 1);
                END IF;
                EXIT WHEN cardinality(taken) + cardinality(got) >= wanted OR scan <= 0;
            END LOOP;
            taken := taken || got;
            CONTINUE;
        END IF;
        taken := taken || got;
        rooms := rooms || jsonb_build_object(key, (rooms ->> key)::integer - cardinality(got));
        starts := starts || jsonb_build_object(
            key, coalesce((starts ->> key)::integer, 0) + cardinality(got));
    END LOOP;
    IF lim.rate IS NOT NULL THEN
        PERFORM jobrunner_rate_count(lim, s.key, s.value::integer, now)
        FROM jsonb_each_text(starts) AS s(key, value)
        WHERE s.value::integer > 0;
    END IF;
    RETURN taken;
END
$$;

-- The ids of the runs the claim may take now of the limited types among `job_types` (less the
-- paused ones), at most `wanted` in all, locked; each type's tenants walked from the one after
-- `start` (NULL: from the first).
CREATE FUNCTION jobrunner_claimable_limited(job_types text[], wanted integer, now timestamptz,
                                            start text)
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    lim job_type_limits;
    taken bigint[] := '{}';
BEGIN
    FOR lim IN
        SELECT * FROM job_type_limits l
        WHERE l.job_type = ANY(job_types)
          AND NOT EXISTS (SELECT 1 FROM job_type_pauses p WHERE p.job_type = l.job_type)
        ORDER BY l.job_type
    LOOP
        EXIT WHEN cardinality(taken) >= wanted;
        taken := taken || jobrunner_limited_run_ids(
            lim, wanted - cardinality(taken), 10 * wanted + 100, now, start);
    END LOOP;
    RETURN taken;
END
$$;

-- Unique while active: at most one unfinished run per (type, tenant, key). Once it has
-- finished the key is free again. Unlike the idempotency key, which is unique forever.
ALTER TABLE job_runs ADD COLUMN unique_key text;
CREATE UNIQUE INDEX job_runs_unique_while_active
    ON job_runs (job_type, (coalesce(tenant_id, '')), unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('queued', 'running', 'failed');


-- A debounce (`enqueue --unique-key K --replace`): each run `ids[i]`, if it still holds the
-- unique key `unique_keys[i]` and waits for its first attempt, takes payload `payloads[i]` and
-- run_at `run_ats[i]`. As the owner: an enqueuer may change a waiting run this way, and no
-- other, without a grant to update runs.
CREATE FUNCTION jobrunner_replace_waiting(ids bigint[], unique_keys text[], payloads jsonb[],
                                          run_ats timestamptz[])
RETURNS integer
LANGUAGE sql VOLATILE SECURITY DEFINER AS $$
    WITH replaced AS (
        UPDATE job_runs r
        SET payload = o.payload, run_at = o.run_at, updated_at = statement_timestamp()
        FROM unnest(ids, unique_keys, payloads, run_ats) AS o(id, unique_key, payload, run_at)
        WHERE r.id = o.id AND r.unique_key = o.unique_key
          AND r.status = 'queued' AND r.attempts = 0
        RETURNING r.id
    )
    SELECT count(*)::integer FROM replaced
$$;
REVOKE ALL ON FUNCTION jobrunner_replace_waiting(bigint[], text[], jsonb[], timestamptz[])
    FROM PUBLIC;

-- As every function jobrunner installs (see 0007, 0010): names resolve in its own schema,
-- then pg_temp, last, whatever the search_path of the session that calls it.
SELECT jobrunner_pin_search_paths();
