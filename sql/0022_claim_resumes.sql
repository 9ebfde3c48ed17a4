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

-- The full claim (as in 0021), each tenant's scan starting at the first waiting run the walk
-- found for it rather than at the front of its dead entries. The job type is tested as
-- `(... = ANY(types)) IS TRUE`, which no index can answer: else, with the scan's start key on
-- (run_at, id), job_runs_waiting_by_type answers every condition, and a planner without
-- statistics (a fresh table after a burst of enqueues) takes it and sorts a type's whole
-- backlog, where job_runs_dispatch gives the runs in order and stops after the share.
CREATE OR REPLACE FUNCTION jobrunner_claimable_fair(types text[], wanted integer,
                                                    cursor_priority integer, cursor_tenant text,
                                                    now timestamptz)
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
    -- The lowest first waiting run among the pairs walked: where the fill below starts.
    low_priority integer;
    low_tenant text;
    low_run_at timestamptz;
    low_id bigint;
BEGIN
    IF wanted <= 0 OR cardinality(types) = 0 THEN
        RETURN '{}';
    END IF;
    FOR walked IN
        SELECT w.priority, w.tenant, w.step, w.first_run_at, w.first_id,
               count(*) OVER (PARTITION BY w.priority) AS peers
        FROM jobrunner_tenant_walk(cursor_priority, cursor_tenant, wanted) w
    LOOP
        IF low_priority IS NULL
           OR (walked.priority, walked.tenant, walked.first_run_at, walked.first_id)
              < (low_priority, low_tenant, low_run_at, low_id) THEN
            low_priority := walked.priority;
            low_tenant := walked.tenant;
            low_run_at := walked.first_run_at;
            low_id := walked.first_id;
        END IF;
        got := ARRAY(
            SELECT r.id FROM job_runs r
            WHERE r.status IN ('queued', 'failed') AND r.priority = walked.priority
              AND coalesce(r.tenant_id, '') = walked.tenant
              AND (r.run_at, r.id) >= (walked.first_run_at, walked.first_id)
              AND r.run_at <= now AND (r.job_type = ANY(types)) IS TRUE
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
    IF cardinality(handed) < wanted AND low_priority IS NOT NULL THEN
        -- Runs this claim locked and left (a share rounded up) are its own: SKIP LOCKED would
        -- not skip them. From the lowest first run walked, not from the front of the dead.
        handed := handed || ARRAY(
            SELECT r.id FROM job_runs r
            WHERE r.status IN ('queued', 'failed') AND r.run_at <= now
              AND (r.priority, coalesce(r.tenant_id, ''), r.run_at, r.id)
                  >= (low_priority, low_tenant, low_run_at, low_id)
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
-- while another claim held it); the tick's next full claim finds them (cronjob/tick/resume.py says
-- when that is). With no floors (NULL) it is the full claim. The job type is tested as in
-- jobrunner_claimable_fair, for the same reason.
CREATE FUNCTION jobrunner_claimable_resumed(types text[], wanted integer,
                                            cursor_priority integer, cursor_tenant text,
                                            now timestamptz, floor_priorities integer[],
                                            floor_tenants text[], floor_run_ats timestamptz[],
                                            floor_ids bigint[])
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    walked record;
    got bigint[];
    ids bigint[] := '{}';
    priorities integer[] := '{}';
    turns integer[] := '{}';
    steps integer[] := '{}';
BEGIN
    IF floor_priorities IS NULL THEN
        RETURN jobrunner_claimable_fair(types, wanted, cursor_priority, cursor_tenant, now);
    END IF;
    IF wanted <= 0 OR cardinality(types) = 0 THEN
        RETURN '{}';
    END IF;
    -- The pairs in the order the walk would give them: the priorities before the cursor's,
    -- that priority's tenants after the cursor's and then up to it, the priorities after.
    FOR walked IN
        SELECT k.*, count(*) OVER (PARTITION BY k.priority) AS peers
        FROM (
            SELECT f.priority, f.tenant, f.run_at, f.id,
                   row_number() OVER (ORDER BY f.phase, f.priority, f.tenant)::integer AS step
            FROM (
                SELECT u.*, CASE WHEN u.priority < cursor_priority THEN 1
                                 WHEN u.priority = cursor_priority
                                      AND u.tenant > cursor_tenant THEN 2
                                 WHEN u.priority = cursor_priority THEN 3
                                 ELSE 4 END AS phase
                FROM unnest(floor_priorities, floor_tenants, floor_run_ats, floor_ids)
                    AS u(priority, tenant, run_at, id)
            ) f
            ORDER BY step LIMIT wanted
        ) k
        ORDER BY k.step
    LOOP
        got := ARRAY(
            SELECT r.id FROM job_runs r
            WHERE r.status IN ('queued', 'failed') AND r.priority = walked.priority
              AND coalesce(r.tenant_id, '') = walked.tenant
              AND (r.run_at, r.id) > (walked.run_at, walked.id)
              AND r.run_at <= now AND (r.job_type = ANY(types)) IS TRUE
              AND (NOT r.exclusive OR jobrunner_exclusive_run_is_next(r))
            ORDER BY r.run_at, r.id
            LIMIT ceil(wanted::numeric / walked.peers)
            FOR UPDATE SKIP LOCKED);
        ids := ids || got;
        priorities := priorities || array_fill(walked.priority, ARRAY[cardinality(got)]);
        turns := turns || ARRAY(SELECT generate_series(1, cardinality(got)));
        steps := steps || array_fill(walked.step, ARRAY[cardinality(got)]);
    END LOOP;
    RETURN ARRAY(
        SELECT u.id FROM unnest(ids, priorities, turns, steps) AS u(id, priority, turn, step)
        ORDER BY u.priority, u.turn, u.step
        LIMIT wanted);
END
$$;

-- As every function jobrunner installs (see 0007, 0010): names resolve in its own schema,
-- then pg_temp, last, whatever the search_path of the session that calls it.
SELECT jobrunner_pin_search_paths();
