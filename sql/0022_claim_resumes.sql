-- A claim that resumes where the tick's last one stopped (README "A claim under a held
-- snapshot"). A claimed run leaves its entry in job_runs_dispatch until VACUUM removes it,
-- and VACUUM removes nothing that a transaction still open might see: while a snapshot is
-- held, every claim and finish leaves a dead entry at the front of its tenant's runs, and a
-- scan from that front visits each of them, and its heap tuple, before the first run it may
-- take. So a claim resumes from the last run the tick took of each tenant, and only a full
-- claim, which a tick makes first and then now and then, starts from the front.

-- The walk, as in 0021, now giving each pair's first waiting run too, from the same probe:
-- the full claim starts each tenant's scan there rather than at the front. A probe whose
-- answer an earlier phase found already (the very first pair, which phases 2, 3 and 4 may
-- start from) is not made again: each is a walk through the same dead entries.
DROP FUNCTION jobrunner_tenant_walk(integer, text, integer);
CREATE FUNCTION jobrunner_tenant_walk(cursor_priority integer, cursor_tenant text, most integer)
RETURNS TABLE (priority integer, tenant text, step integer, first_run_at timestamptz,
               first_id bigint)
LANGUAGE plpgsql STABLE ROWS 10 AS $$
#variable_conflict use_column
DECLARE
    p integer;
    t text;
    ra timestamptz;
    i bigint;
    n integer := 0;
    phase integer;
    -- The first waiting run of all: what phase 1's first probe finds.
    p0 integer;
    t0 text;
    ra0 timestamptz;
    i0 bigint;
BEGIN
    SELECT r.priority, coalesce(r.tenant_id, ''), r.run_at, r.id INTO p0, t0, ra0, i0
    FROM job_runs r
    WHERE r.status IN ('queued', 'failed')
    ORDER BY r.priority, coalesce(r.tenant_id, ''), r.run_at, r.id LIMIT 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    FOR phase IN 1..4 LOOP
        p := NULL;
        LOOP
            EXIT WHEN n >= most;
            IF p IS NOT NULL THEN
                SELECT r.priority, coalesce(r.tenant_id, ''), r.run_at, r.id INTO p, t, ra, i
                FROM job_runs r
                WHERE r.status IN ('queued', 'failed')
                  AND (r.priority, coalesce(r.tenant_id, '')) > (p, t)
                ORDER BY r.priority, coalesce(r.tenant_id, ''), r.run_at, r.id LIMIT 1;
            ELSIF phase = 1
                  OR (phase = 2 AND (p0, t0) > (cursor_priority, cursor_tenant))
                  OR (phase = 3 AND p0 >= cursor_priority)
                  OR (phase = 4 AND p0 > cursor_priority) THEN
                p := p0; t := t0; ra := ra0; i := i0;
            ELSIF phase = 2 THEN
                SELECT r.priority, coalesce(r.tenant_id, ''), r.run_at, r.id INTO p, t, ra, i
                FROM job_runs r
                WHERE r.status IN ('queued', 'failed')
                  AND (r.priority, coalesce(r.tenant_id, '')) > (cursor_priority, cursor_tenant)
                ORDER BY r.priority, coalesce(r.tenant_id, ''), r.run_at, r.id LIMIT 1;
            ELSIF phase = 3 THEN
                SELECT r.priority, coalesce(r.tenant_id, ''), r.run_at, r.id INTO p, t, ra, i
                FROM job_runs r
                WHERE r.status IN ('queued', 'failed') AND r.priority >= cursor_priority
                ORDER BY r.priority, coalesce(r.tenant_id, ''), r.run_at, r.id LIMIT 1;
            ELSE
                SELECT r.priority, coalesce(r.tenant_id, ''), r.run_at, r.id INTO p, t, ra, i
                FROM job_runs r
                WHERE r.status IN ('queued', 'failed') AND r.priority > cursor_priority
                ORDER BY r.priority, coalesce(r.tenant_id, ''), r.run_at, r.id LIMIT 1;
            END IF;
            EXIT WHEN p IS NULL
                OR (phase = 1 AND p >= cursor_priority)
                OR (phase = 2 AND p <> cursor_priority)
                OR (phase = 3 AND (p <> cursor_priority OR t > cursor_tenant));
            n := n + 1;
            priority := p;
            tenant := t;
            step := n;
            first_run_at := ra;
            first_id := i;
            RETURN NEXT;
        END LOOP;
    END LOOP;
END
$$;

-- What both claims below share: each (priority, tenant) pair given (parallel arrays, in the
-- order the walk gives them) gets an equal share of `wanted` among the pairs of its priority,
-- its earliest due runs from (`from_run_ats`, `from_ids`) on, locked. Returns every run locked,
-- in the order they are handed to the workers: by priority, then turn by turn, pair after pair
-- (a share rounded up may lock more than `wanted`). The job type is tested as
-- `(... = ANY(types)) IS TRUE`, which no index can answer: else, with the scan's start key on
-- (run_at, id), job_runs_waiting_by_type answers every condition, and a planner without
-- statistics (a fresh table after a burst of enqueues) takes it and sorts a type's whole
-- backlog, where job_runs_dispatch gives the runs in order and stops after the share.
CREATE FUNCTION jobrunner_claimable_shares(types text[], wanted integer,
                                           pair_priorities integer[], pair_tenants text[],
                                           from_run_ats timestamptz[], from_ids bigint[],
                                           now timestamptz)
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    pair record;
    got bigint[];
    ids bigint[] := '{}';
    priorities integer[] := '{}';
    turns integer[] := '{}';
    steps integer[] := '{}';
BEGIN
    FOR pair IN
        SELECT u.*, count(*) OVER (PARTITION BY u.priority) AS peers
        FROM unnest(pair_priorities, pair_tenants, from_run_ats, from_ids)
            WITH ORDINALITY AS u(priority, tenant, run_at, id, step)
        ORDER BY u.step
    LOOP
        got := ARRAY(
            SELECT r.id FROM job_runs r
            WHERE r.status IN ('queued', 'failed') AND r.priority = pair.priority
              AND coalesce(r.tenant_id, '') = pair.tenant
              AND (r.run_at, r.id) >= (pair.run_at, pair.id)
              AND r.run_at <= now AND (r.job_type = ANY(types)) IS TRUE
              AND (NOT r.exclusive OR jobrunner_exclusive_run_is_next(r))
            ORDER BY r.run_at, r.id
            LIMIT ceil(wanted::numeric / pair.peers)
            FOR UPDATE SKIP LOCKED);
        ids := ids || got;
        priorities := priorities || array_fill(pair.priority, ARRAY[cardinality(got)]);
        turns := turns || ARRAY(SELECT generate_series(1, cardinality(got)));
        steps := steps || array_fill(pair.step::integer, ARRAY[cardinality(got)]);
    END LOOP;
    RETURN ARRAY(
        SELECT u.id FROM unnest(ids, priorities, turns, steps) AS u(id, priority, turn, step)
        ORDER BY u.priority, u.turn, u.step);
END
$$;

-- The full claim (as in 0021): the pairs of the walk, each tenant's scan starting at the first
-- waiting run the walk found for it rather than at the front of its dead entries; a claim
-- that comes back short fills up in dispatch order from the lowest of those runs.
CREATE OR REPLACE FUNCTION jobrunner_claimable_fair(types text[], wanted integer,
                                                    cursor_priority integer, cursor_tenant text,
                                                    now timestamptz)
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    walk record;
    low record;
    ids bigint[];
    handed bigint[];
BEGIN
    IF wanted <= 0 OR cardinality(types) = 0 THEN
        RETURN '{}';
    END IF;
    SELECT array_agg(w.priority ORDER BY w.step) AS priorities,
           array_agg(w.tenant ORDER BY w.step) AS tenants,
           array_agg(w.first_run_at ORDER BY w.step) AS run_ats,
           array_agg(w.first_id ORDER BY w.step) AS ids
    INTO walk
    FROM jobrunner_tenant_walk(cursor_priority, cursor_tenant, wanted) w;
    IF walk.priorities IS NULL THEN  -- nothing waits
        RETURN '{}';
    END IF;
    ids := jobrunner_claimable_shares(types, wanted, walk.priorities, walk.tenants,
                                      walk.run_ats, walk.ids, now);
    handed := ids[1:wanted];
    IF cardinality(handed) < wanted THEN
        SELECT u.* INTO low
        FROM unnest(walk.priorities, walk.tenants, walk.run_ats, walk.ids)
            AS u(priority, tenant, run_at, id)
        ORDER BY u.priority, u.tenant, u.run_at, u.id LIMIT 1;
        -- Runs this claim locked and left (a share rounded up) are its own: SKIP LOCKED would
        -- not skip them.
        handed := handed || ARRAY(
            SELECT r.id FROM job_runs r
            WHERE r.status IN ('queued', 'failed') AND r.run_at <= now
              AND (r.priority, coalesce(r.tenant_id, ''), r.run_at, r.id)
                  >= (low.priority, low.tenant, low.run_at, low.id)
              AND (r.job_type = ANY(types)) IS TRUE AND r.id <> ALL(ids)
              AND (NOT r.exclusive OR jobrunner_exclusive_run_is_next(r))
            ORDER BY r.priority, coalesce(r.tenant_id, ''), r.run_at, r.id
            LIMIT wanted - cardinality(handed)
            FOR UPDATE SKIP LOCKED);
    END IF;
    RETURN handed;
END
$$;

-- A claim that resumes: as jobrunner_claimable_fair, over the (priority, tenant) pairs the
-- tick took runs of since its last full claim, each scanned from after the last run the tick
-- took of it (`floor_*`, parallel arrays: a pair and its last run's run_at and id). No probe
-- starts at the front of a tenant's runs, so none walks the dead entries a held snapshot keeps
-- there. What it cannot see: a tenant the tick has not met since its last full claim, and a
-- run that became due behind a floor (enqueued with a run_at already past, or passed over
-- while another claim held it); the tick's next full claim finds them (cronjob/tick/resume.py
-- says when that is). With no floors (NULL) it is the full claim.
CREATE FUNCTION jobrunner_claimable_resumed(types text[], wanted integer,
                                            cursor_priority integer, cursor_tenant text,
                                            now timestamptz, floor_priorities integer[],
                                            floor_tenants text[], floor_run_ats timestamptz[],
                                            floor_ids bigint[])
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    known record;
BEGIN
    IF floor_priorities IS NULL THEN
        RETURN jobrunner_claimable_fair(types, wanted, cursor_priority, cursor_tenant, now);
    END IF;
    IF wanted <= 0 OR cardinality(types) = 0 THEN
        RETURN '{}';
    END IF;
    -- The pairs in the order the walk would give them: the priorities before the cursor's,
    -- that priority's tenants after the cursor's and then up to it, the priorities after.
    -- Each from just after its floor: ids are whole numbers, so > (run_at, id) is
    -- >= (run_at, id + 1).
    SELECT array_agg(k.priority ORDER BY k.step) AS priorities,
           array_agg(k.tenant ORDER BY k.step) AS tenants,
           array_agg(k.run_at ORDER BY k.step) AS run_ats,
           array_agg(k.id + 1 ORDER BY k.step) AS ids
    INTO known
    FROM (
        SELECT u.*, row_number() OVER (
            ORDER BY CASE WHEN u.priority < cursor_priority THEN 1
                          WHEN u.priority = cursor_priority AND u.tenant > cursor_tenant THEN 2
                          WHEN u.priority = cursor_priority THEN 3
                          ELSE 4 END,
                     u.priority, u.tenant) AS step
        FROM unnest(floor_priorities, floor_tenants, floor_run_ats, floor_ids)
            AS u(priority, tenant, run_at, id)
        ORDER BY step LIMIT wanted
    ) k;
    RETURN (jobrunner_claimable_shares(types, wanted, known.priorities, known.tenants,
                                       known.run_ats, known.ids, now))[1:wanted];
END
$$;

-- As every function jobrunner installs (see 0007, 0010): names resolve in its own schema,
-- then pg_temp, last, whatever the search_path of the session that calls it.
SELECT jobrunner_pin_search_paths();
