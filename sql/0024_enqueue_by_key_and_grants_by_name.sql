-- What a login may do is what it needs, from the moment `jobrunner migrate` commits, whether or
-- not deploy/roles.sql runs again after it (the Kubernetes flow runs it once, before):
-- (1) the enqueuer reads back only the run that holds a key it names, and a debounce rewrites
--     only a waiting run of that key's type and tenant, enqueued by the same login;
-- (2) a run log is kept only for an attempt its run made;
-- (3) each role's grants on jobrunner's tables are given by name, here, rather than left to
--     the default privileges of roles.sql, which gave the worker writes to every new table.

-- (1) The login that enqueued a run, as the database knows it (session_user), beside the
-- run: a debounce rewrites only the runs its own login enqueued. Set by the column's default,
-- which the enqueuer cannot override: its INSERT grant does not name the column. NULL for the
-- runs enqueued before this migration. No default at first: the column is added without a
-- rewrite of the table, and its lock is held for an instant.
ALTER TABLE job_runs ADD COLUMN enqueued_by text;
ALTER TABLE job_runs ALTER COLUMN enqueued_by SET DEFAULT session_user;

-- The runs that hold the keys an enqueue names, for the enqueuer, who may read nothing of
-- job_runs: for each (job type, tenant, idempotency key, unique key) given, numbered from 1
-- as given (`place`), the run of that type and tenant that holds the idempotency key, else
-- the unfinished one that holds the unique key; nothing for a key no run holds. Its id, its
-- result id and its enqueue time (Django's TaskResult), no more. STABLE: called in the
-- enqueue's insert, it sees the runs as they were when that statement started; called in a
-- statement of its own, the runs committed since and those the transaction inserted.
-- The lookups are those of the unique indexes (0017, 0021), each an index probe.
CREATE FUNCTION jobrunner_runs_holding_keys(job_types text[], tenant_ids text[],
                                            idempotency_keys text[], unique_keys text[])
RETURNS TABLE (place bigint, id bigint, result_id uuid, created_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT k.place, coalesce(by_key.id, by_unique.id),
           CASE WHEN by_key.id IS NOT NULL THEN by_key.result_id ELSE by_unique.result_id END,
           coalesce(by_key.created_at, by_unique.created_at)
    FROM unnest(job_types, tenant_ids, idempotency_keys, unique_keys)
        WITH ORDINALITY AS k(job_type, tenant_id, idempotency_key, unique_key, place)
    LEFT JOIN LATERAL (
        SELECT r.id, r.result_id, r.created_at FROM job_runs r
        WHERE r.idempotency_key = k.idempotency_key AND r.job_type = k.job_type
          AND coalesce(r.tenant_id, '') = coalesce(k.tenant_id, '')
    ) by_key ON true
    LEFT JOIN LATERAL (
        SELECT r.id, r.result_id, r.created_at FROM job_runs r
        WHERE by_key.id IS NULL
          AND r.unique_key = k.unique_key AND r.job_type = k.job_type
          AND coalesce(r.tenant_id, '') = coalesce(k.tenant_id, '')
          AND r.status IN ('queued', 'running', 'failed')
    ) by_unique ON true
    WHERE by_key.id IS NOT NULL OR by_unique.id IS NOT NULL
$$;
REVOKE ALL ON FUNCTION jobrunner_runs_holding_keys(text[], text[], text[], text[]) FROM PUBLIC;

-- A debounce (`enqueue --unique-key K --replace`), as 0021's, which matched a run by its id
-- and unique key alone: any login that could call it could rewrite any tenant's waiting run
-- (its payload, and a run_at of 'infinity'). Now each run `ids[i]` is rewritten only if it
-- is of job type `job_types[i]` and tenant `tenant_ids[i]`, holds the unique key
-- `unique_keys[i]`, waits for its first attempt, and was enqueued by this login (or the
-- login may rewrite payloads anyway: the worker, the owner). It takes payload `payloads[i]`,
-- refused as every door refuses it (cronjob/inputs.py: more than 1,000,000 bytes of JSON
-- text, containers nested more than 64 deep), and run_at `run_ats[i]`, brought into the
-- range every door accepts (1900-01-01 to 9000-01-01 UTC). As the owner: the enqueuer has
-- no grant to update runs.
DROP FUNCTION jobrunner_replace_waiting(bigint[], text[], jsonb[], timestamptz[]);
CREATE FUNCTION jobrunner_replace_waiting(ids bigint[], job_types text[], tenant_ids text[],
                                          unique_keys text[], payloads text[],
                                          run_ats timestamptz[])
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
DECLARE
    rewrites_any boolean := has_column_privilege(session_user, 'job_runs', 'payload', 'UPDATE');
    replaced integer;
BEGIN
    IF EXISTS (SELECT FROM unnest(payloads) AS p(doc) WHERE octet_length(p.doc) > 1000000) THEN
        RAISE EXCEPTION 'payload too large: more than 1000000 bytes of JSON'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (
        SELECT FROM unnest(payloads) AS p(doc)
        WHERE jsonb_path_exists(p.doc::jsonb,
                                'strict $.**{64} ? (@.type() == "object" || @.type() == "array")')
    ) THEN
        RAISE EXCEPTION 'payload nested deeper than 64 levels'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE job_runs r
    SET payload = o.payload::jsonb,
        run_at = least(greatest(coalesce(o.run_at, r.run_at), '1900-01-01 00:00:00+00'),
                       '9000-01-01 00:00:00+00'),
        updated_at = statement_timestamp()
    FROM unnest(ids, job_types, tenant_ids, unique_keys, payloads, run_ats)
        AS o(id, job_type, tenant_id, unique_key, payload, run_at)
    WHERE r.id = o.id AND r.job_type = o.job_type
      AND coalesce(r.tenant_id, '') = coalesce(o.tenant_id, '')
      AND r.unique_key = o.unique_key
      AND r.status = 'queued' AND r.attempts = 0
      AND (r.enqueued_by = session_user OR rewrites_any);
    GET DIAGNOSTICS replaced = ROW_COUNT;
    RETURN replaced;
END
$$;
REVOKE ALL ON FUNCTION jobrunner_replace_waiting(bigint[], text[], text[], text[], text[],
                                                 timestamptz[])
    FROM PUBLIC;

-- (2) A run log belongs to an attempt its run made: the finalize that records the attempt's
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

-- (3) What each role of deploy/roles.sql may do on each of jobrunner's tables: a privilege on
-- the whole table, or (columns) on those columns only. Read with cronjob/queries/: each grant
-- is what a statement of a role's commands needs. A later migration that adds a table, or a
-- column a role writes, replaces this function with its own list and calls
-- jobrunner_grant_roles() in the transaction that creates them.
CREATE FUNCTION jobrunner_role_grants()
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

        -- Tables of later migrations, granted once they exist (each calls
        -- jobrunner_grant_roles() in the transaction that creates its table; a column
        -- named here that is not there yet, job_runs.batch_id of 0026, waits as well).
        -- The job types a tick has handlers for (0025): the tick records them, status
        -- reads them.
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

        -- The ticks that stay (0027): each keeps its row, and deletes the rows of ticks that were killed.
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
CREATE FUNCTION jobrunner_grant_roles() RETURNS void
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

-- As every function jobrunner installs (see 0007, 0010): names resolve in its own schema,
-- then pg_temp, last, whatever the search_path of the session that calls it; for a SECURITY
-- DEFINER function above all.
SELECT jobrunner_pin_search_paths();

SELECT jobrunner_grant_roles();
