-- Flow control made safe against what a run's key and a session may be
-- (docs/guides/flow-control.md, docs/explanation/security.md): a key of any length, a rate that holds over every span of its period,
-- a key without room that no longer stops the walk of the others, a key locked by another
-- session told apart from one without room, and a limited type whose choice fails failing
-- alone.

-- A rate is now one timestamp per (type, key), its theoretical arrival time (TAT): the
-- earliest the key's next run may start. Fixed windows aligned to the epoch (0021) let 2N
-- starts fall within moments of each other, N at the end of a window and N at the start of
-- the next. A generic cell rate algorithm instead, with T the period over the rate (rounded
-- up to the microsecond, timestamps' resolution, so that N of them are never shorter than the
-- period): a claim at `now` may start k runs of a key when k <= N and now >= TAT + (k - 1)T,
-- and moves the TAT to now + kT. A key idle for a period starts N at once, a busy one one
-- every T. Unlike the usual burst tolerance (k <= N whenever now >= TAT, which lets 2N - 1
-- start within one period), this keeps every span of one period to N starts: after any
-- claim, the r-th most recent start is at least (r + 1)T before the TAT, so the N-th before
-- a new start is at least a period before it. A key is stored as the SHA-256 of its text: it
-- is any text a payload holds, and an index entry holds at most 2,704 bytes.
DROP FUNCTION jobrunner_limited_run_ids(job_type_limits, integer, integer, timestamptz, text);
DROP FUNCTION jobrunner_rate_count(job_type_limits, text, integer, timestamptz);
DROP FUNCTION jobrunner_limit_room(job_type_limits, text, timestamptz);
DROP TABLE job_rate_windows;

CREATE TABLE job_rate_arrivals (
    job_type    text NOT NULL,
    key_digest  bytea NOT NULL,         -- sha256 of the key's text, as UTF-8
    next_start  timestamptz NOT NULL,   -- no run of the key starts before this
    PRIMARY KEY (job_type, key_digest)
);

-- Each role's grants on it, those of deploy/roles.sql, from the migration that creates it:
-- until roles.sql runs again (the Kubernetes flow runs it once, before the first migrate),
-- default privileges would give the worker DELETE too, and the operator, whose `limit`
-- forgets a type's keys, nothing.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'jobrunner_worker') THEN
        REVOKE ALL ON job_rate_arrivals FROM jobrunner_worker;
        GRANT SELECT, INSERT, UPDATE ON job_rate_arrivals TO jobrunner_worker;
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'jobrunner_reader') THEN
        REVOKE ALL ON job_rate_arrivals FROM jobrunner_reader;
        GRANT SELECT ON job_rate_arrivals TO jobrunner_reader;
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'jobrunner_operator') THEN
        GRANT SELECT, DELETE ON job_rate_arrivals TO jobrunner_operator;
    END IF;
END
$$;

CREATE FUNCTION jobrunner_limit_key_digest(key text)
RETURNS bytea
LANGUAGE sql IMMUTABLE AS $$
    SELECT sha256(convert_to(key, 'UTF8'))
$$;

-- T, the interval of a rate, in microseconds: the period over the rate, rounded up.
CREATE FUNCTION jobrunner_rate_interval_us(lim job_type_limits)
RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT ceil(lim.rate_period::numeric * 1000000 / lim.rate)::bigint
$$;

-- A key's lock is a pair of 32-bit numbers, each a hash: of the type (jobrunner's namespace
-- and the type's name), so that `status` can tell whose lock a session holds, and of the key
-- (fixed-size, whatever the key's length). Keys whose hashes meet share a lock: their claims
-- take turns, no more.
CREATE FUNCTION jobrunner_limit_lock_class(job_type text)
RETURNS integer
LANGUAGE sql IMMUTABLE AS $$
    SELECT hashtext('jobrunner.limit' || chr(31) || job_type)
$$;

-- How many more runs of a key may start now under its type's limit, and why none may: the
-- key's lock is taken with try, transaction-scoped, and counted after it is held (as in 0021:
-- each count a statement of its own, its snapshot taken after the previous holder
-- committed). `locked`: another session holds the key's lock. `next_start`: the rate holds
-- the key back until then.
CREATE FUNCTION jobrunner_limit_room(lim job_type_limits, key text, now timestamptz,
                                     OUT room integer, OUT locked boolean,
                                     OUT next_start timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    used integer;
BEGIN
    room := 2147483647;
    locked := NOT pg_try_advisory_xact_lock(jobrunner_limit_lock_class(lim.job_type),
                                             hashtext(key));
    IF locked THEN
        room := 0;
        RETURN;
    END IF;
    IF lim.concurrency IS NOT NULL THEN
        SELECT count(*) INTO used FROM job_runs r
        WHERE r.status = 'running' AND r.locked_until >= now AND r.job_type = lim.job_type
          AND jobrunner_limit_key(lim.per, lim.per_field, r.tenant_id, r.payload) = key;
        room := lim.concurrency - used;
    END IF;
    IF lim.rate IS NOT NULL THEN
        SELECT a.next_start INTO next_start FROM job_rate_arrivals a
        WHERE a.job_type = lim.job_type AND a.key_digest = jobrunner_limit_key_digest(key);
        IF next_start > now THEN
            room := 0;
        ELSIF next_start IS NULL THEN
            room := least(room, lim.rate);
        ELSE
            -- 1 + the whole intervals since the TAT, counted in whole microseconds (extract
            -- gives a float on PostgreSQL 13).
            room := least(room, lim.rate, 1 + least(
                floor(round(extract(epoch FROM now - next_start) * 1000000)::numeric
                      / jobrunner_rate_interval_us(lim)),
                2147483646)::integer);
            next_start := NULL;
        END IF;
    END IF;
    room := greatest(room, 0);
END
$$;

-- Whether the session holding a key's lock holds it otherwise than a claim does: a claim's
-- transaction holds it while its statement runs, for milliseconds; one that is idle, or whose
-- transaction began over 30 seconds ago, holds it. A session of another login shows no state
-- or start to a login without pg_read_all_stats, and counts as holding it.
CREATE FUNCTION jobrunner_limit_lock_held(job_type text, key text)
RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT NOT EXISTS (
        SELECT 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
          AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
          AND l.classid = jobrunner_limit_lock_class(job_type)::oid
          AND l.objid = hashtext(key)::oid
          AND a.state = 'active' AND a.xact_start > clock_timestamp() - interval '30 seconds')
$$;

-- `starts` more starts of a key now, under its type's rate.
CREATE FUNCTION jobrunner_rate_started(lim job_type_limits, key text, starts integer,
                                       now timestamptz)
RETURNS void
LANGUAGE sql VOLATILE AS $$
    INSERT INTO job_rate_arrivals AS a (job_type, key_digest, next_start)
    VALUES (lim.job_type, jobrunner_limit_key_digest(key),
            now + interval '1 microsecond' * (starts * jobrunner_rate_interval_us(lim)))
    ON CONFLICT (job_type, key_digest) DO UPDATE
    SET next_start = greatest(a.next_start, now)
                     + interval '1 microsecond' * (starts * jobrunner_rate_interval_us(lim))
$$;

-- The ids of the runs of a limited type the claim may take now, at most `wanted`, locked, as
-- in 0021: the type's waiting runs walked tenant by tenant from the tenant after `start`
-- round to it, each run taken while its key has room; a key's room asked once, when the walk
-- first meets it. Under a limit per payload field the walk reads at most `scan` runs whose
-- key has room or is met for the first time. A run of a key known to have no room costs it
-- nothing of that: the walk passes over it, and leaves a tenant for the next once it passed
-- over `scan` such runs in a row (10 * `scan` in all), so that one key's backlog cannot keep
-- every other tenant's runs from their turn. Also returns whether another session holds a
-- key's lock for longer than a claim would (`held`), and when the earliest key whose due runs
-- a rate holds back may start again (`next_start`).
CREATE FUNCTION jobrunner_limited_run_ids(lim job_type_limits, wanted integer, scan integer,
                                          now timestamptz, start text,
                                          OUT ids bigint[], OUT held boolean,
                                          OUT next_start timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    tenant text := start;
    found_tenant text;
    wrapped boolean := start IS NULL;
    key text;
    rooms jsonb := '{}';
    asked record;
    room integer;
    got bigint[];
    run record;
    starts jsonb := '{}';
    patience integer := scan;
    passable integer := 10 * scan;
    passed integer;
    checked boolean := false;  -- the holder of a locked key was looked at: once a claim
    gap interval := CASE WHEN lim.rate IS NOT NULL
                         THEN interval '1 microsecond' * jobrunner_rate_interval_us(lim) END;
BEGIN
    ids := '{}';
    held := false;
    WHILE cardinality(ids) < wanted AND scan > 0 AND passable > 0 LOOP
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
                asked := jobrunner_limit_room(lim, key, now);
                rooms := rooms || jsonb_build_object(key, asked.room);
                IF asked.locked AND NOT checked THEN
                    checked := true;
                    held := jobrunner_limit_lock_held(lim.job_type, key);
                END IF;
                -- Held back by the rate: worth a tick's wait only if a run of the key is due.
                IF asked.next_start IS NULL THEN
                    NULL;
                ELSIF lim.per = 'tenant' THEN
                    IF EXISTS (SELECT 1 FROM job_runs r
                               WHERE r.status IN ('queued', 'failed')
                                 AND r.job_type = lim.job_type
                                 AND coalesce(r.tenant_id, '') = tenant AND r.run_at <= now) THEN
                        next_start := least(next_start, asked.next_start);
                    END IF;
                ELSIF EXISTS (SELECT 1 FROM job_runs r
                              WHERE r.status IN ('queued', 'failed')
                                AND r.job_type = lim.job_type AND r.run_at <= now) THEN
                    next_start := least(next_start, asked.next_start);
                END IF;
            END IF;
            room := least((rooms ->> key)::integer, wanted - cardinality(ids));
            IF room <= 0 THEN
                -- Due, behind runs of its key the rate just let start (in another tenant).
                IF gap IS NOT NULL AND starts ? key AND EXISTS (
                        SELECT 1 FROM job_runs r
                        WHERE r.status IN ('queued', 'failed') AND r.job_type = lim.job_type
                          AND coalesce(r.tenant_id, '') = tenant AND r.run_at <= now) THEN
                    next_start := least(next_start, now + (starts ->> key)::integer * gap);
                END IF;
                CONTINUE WHEN lim.per = 'tenant';
                EXIT;
            END IF;
            got := ARRAY(
                SELECT r.id FROM job_runs r
                WHERE r.status IN ('queued', 'failed') AND r.job_type = lim.job_type
                  AND coalesce(r.tenant_id, '') = tenant AND r.run_at <= now
                  AND (NOT r.exclusive OR jobrunner_exclusive_run_is_next(r))
                ORDER BY r.priority, r.run_at, r.id
                LIMIT room
                FOR UPDATE SKIP LOCKED);
            scan := scan - cardinality(got);
            ids := ids || got;
            rooms := rooms || jsonb_build_object(key, (rooms ->> key)::integer - cardinality(got));
            starts := starts || jsonb_build_object(
                key, coalesce((starts ->> key)::integer, 0) + cardinality(got));
            -- A rate that started the key's runs now holds back the key's next due run, if any
            -- (in this tenant: a limit per type takes no more from the next tenant, unless
            -- its room is left).
            IF gap IS NOT NULL AND cardinality(got) > 0 AND EXISTS (
                    SELECT 1 FROM job_runs r
                    WHERE r.status IN ('queued', 'failed') AND r.job_type = lim.job_type
                      AND coalesce(r.tenant_id, '') = tenant AND r.run_at <= now
                      AND r.id <> ALL(got)) THEN
                next_start := least(next_start, now + (starts ->> key)::integer * gap);
            END IF;
            CONTINUE;
        END IF;
        -- A key per run: read from each run, its room asked the first time it is met.
        passed := 0;
        FOR run IN
            SELECT r.id, coalesce(r.payload ->> lim.per_field, '') AS key FROM job_runs r
            WHERE r.status IN ('queued', 'failed') AND r.job_type = lim.job_type
              AND coalesce(r.tenant_id, '') = tenant AND r.run_at <= now
              AND (NOT r.exclusive OR jobrunner_exclusive_run_is_next(r))
            ORDER BY r.priority, r.run_at, r.id
            LIMIT scan + least(patience, passable)
        LOOP
            IF NOT rooms ? run.key THEN
                scan := scan - 1;
                asked := jobrunner_limit_room(lim, run.key, now);
                rooms := rooms || jsonb_build_object(run.key, asked.room);
                IF asked.locked AND NOT checked THEN
                    checked := true;
                    held := jobrunner_limit_lock_held(lim.job_type, run.key);
                END IF;
                next_start := least(next_start, asked.next_start);
            ELSIF (rooms ->> run.key)::integer > 0 THEN
                scan := scan - 1;
            END IF;
            IF (rooms ->> run.key)::integer <= 0 THEN
                IF gap IS NOT NULL AND starts ? run.key THEN
                    -- Due, behind a run of its key the rate just let start.
                    next_start := least(next_start, now + (starts ->> run.key)::integer * gap);
                END IF;
                passed := passed + 1;
                passable := passable - 1;
                EXIT WHEN passed >= patience OR passable <= 0;
            ELSIF EXISTS (
                    SELECT 1 FROM job_runs r
                    WHERE r.id = run.id AND r.status IN ('queued', 'failed')
                    FOR UPDATE SKIP LOCKED) THEN
                passed := 0;
                ids := ids || run.id;
                rooms := rooms || jsonb_build_object(run.key, (rooms ->> run.key)::integer - 1);
                starts := starts || jsonb_build_object(
                    run.key, coalesce((starts ->> run.key)::integer, 0) + 1);
            END IF;
            EXIT WHEN cardinality(ids) >= wanted OR scan <= 0;
        END LOOP;
    END LOOP;
    IF lim.rate IS NOT NULL THEN
        PERFORM jobrunner_rate_started(lim, s.key, s.value::integer, now)
        FROM jsonb_each_text(starts) AS s(key, value)
        WHERE s.value::integer > 0;
    END IF;
END
$$;

-- The ids of the runs the claim may take now of the limited types among `job_types` (less the
-- paused ones), at most `wanted` in all, locked; each type's tenants walked from the one after
-- `start` (NULL: from the first). Each type is chosen in a block of its own: a type whose
-- choice fails (whatever one of its runs holds) is left out of this claim, with its locks and
-- writes, and the others are claimed; the claiming tick is told with a warning. The tick is
-- told too, with a warning, when another session holds a key's lock (tick/notes.py), and, with
-- a notice, in how many seconds the earliest key whose due runs a rate holds back may start.
-- Each block is a subtransaction: a claim over more than 64 limited types that lock runs
-- overflows the subtransaction cache of its backend, which slows the snapshots of others.
CREATE OR REPLACE FUNCTION jobrunner_claimable_limited(job_types text[], wanted integer,
                                                       now timestamptz, start text)
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    lim job_type_limits;
    chosen record;
    taken bigint[] := '{}';
    soonest timestamptz;
BEGIN
    FOR lim IN
        SELECT * FROM job_type_limits l
        WHERE l.job_type = ANY(job_types)
          AND NOT EXISTS (SELECT 1 FROM job_type_pauses p WHERE p.job_type = l.job_type)
        ORDER BY l.job_type
    LOOP
        EXIT WHEN cardinality(taken) >= wanted;
        BEGIN
            chosen := jobrunner_limited_run_ids(
                lim, wanted - cardinality(taken), 10 * wanted + 100, now, start);
            taken := taken || chosen.ids;
            soonest := least(soonest, chosen.next_start);
            IF chosen.held THEN
                RAISE WARNING USING ERRCODE = '01J01', DETAIL = lim.job_type,
                    MESSAGE = 'jobrunner: a key of a limited job type is locked by another session';
            END IF;
        EXCEPTION WHEN OTHERS THEN
            RAISE WARNING USING ERRCODE = '01J02', DETAIL = lim.job_type,
                MESSAGE = 'jobrunner: the runs of a limited job type could not be chosen: '
                          || SQLERRM;
        END;
    END LOOP;
    IF soonest IS NOT NULL THEN
        RAISE NOTICE USING ERRCODE = '01J03',
            DETAIL = greatest(extract(epoch FROM soonest - now), 0)::text,
            MESSAGE = 'jobrunner: a rate holds due runs back';
    END IF;
    RETURN taken;
END
$$;

-- As every function jobrunner installs (see 0007, 0010): names resolve in its own schema,
-- then pg_temp, last, whatever the search_path of the session that calls it.
SELECT jobrunner_pin_search_paths();
