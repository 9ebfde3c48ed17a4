-- roles.sql: the PostgreSQL roles jobrunner runs as, one per job, each with only what it needs.
--
-- Run it as a superuser in the application's database; -v schema names the schema jobrunner
-- lives in (default public; a schema that does not exist yet is created, owned by
-- jobrunner_owner):
--
--   psql -v schema=public -d myapp -f deploy/roles.sql
--
-- It is idempotent. Run it once before the first `jobrunner migrate`: default privileges
-- then give the worker and the reader access to every table that migrations create, now and
-- in later releases, so ticks and monitoring work right after a migration. Run it again
-- after migrating (or run it only then, on a database that was migrated earlier): it sets
-- every role's grants on what exists to exactly those of jobrunner_grants (further down),
-- revoking whatever else an earlier version of this script or a hand-made grant gave (the
-- worker's writes to the audit trail, say), takes ownership of jobrunner's tables and
-- functions if another role created them, and grants what default privileges cannot:
-- column lists, and the enqueuer's and operator's rights, which no table gets by default.
--
-- jobrunner_owner     migrate; trim the audit trail (prune --audit-older-than). Owns the
--                     schema objects.
-- jobrunner_worker    tick: claim, finalize, heartbeat, hand back, rescue, materialize, prune
--                     after the tick, the metrics textfile, pings; and reads what a tick
--                     reads. Reads and writes job_runs, job_attempts, job_effects,
--                     job_run_tally, job_schedule_skips, job_run_logs; reads and updates
--                     job_definitions; reads job_type_pauses, job_type_limits,
--                     job_schedule_health; counts starts in job_rate_windows; keeps its row in
--                     job_ticks (tick --listen). Nothing of the audit trail.
-- jobrunner_enqueuer  apps: enqueue(), enqueue_async() and enqueue_many(), `jobrunner enqueue`
--                     (--jsonl too), Django's Task.enqueue(). Inserts into job_runs the
--                     columns an enqueue sets (by COPY too, in bulk), and reads back id,
--                     job_type, tenant_id, idempotency_key, unique_key, finished_at and
--                     created_at: the id of the run that holds a key. Replaces a waiting
--                     run's payload and run_at only through jobrunner_replace_waiting
--                     (--unique-key with --replace). Nothing else.
-- jobrunner_reader    status, list, show, metrics, check, audit, limits, schedule list/show/preview,
--                     Django's get_result(). Reads every table but job_effects.
-- jobrunner_operator  retry, cancel, prune, pause, resume, limit, schedule add/pause/resume/
--                     remove/sync. Reads and updates the bookkeeping columns of job_runs
--                     (never payloads or return values) and deletes runs; reads and writes
--                     job_definitions, job_type_pauses and job_type_limits; appends to the
--                     audit trail.
--
-- Every role reads jobrunner_migrations (each command checks the schema version); none but
-- the owner can create, alter, drop or truncate anything. The enqueuer reads the id, type,
-- tenant and key of runs through column grants rather than a SECURITY DEFINER function: the
-- insert of cronjob/queries/enqueue.py stays one statement, whatever options a release adds,
-- and the role sees no payload, error, traceback or return value. The operator does not
-- read payloads either: give a person who operates jobrunner_reader as well.
--
-- The audit trail (job_audit, job_audit_batches) is append-only for every role but the owner:
-- no role gets UPDATE or DELETE, and a trigger (migration 0016) refuses them to anyone but
-- the owner even if such a grant is given by mistake. The database sets each entry's time
-- and its login (session_user) itself, whatever the INSERT says.
--
-- The triggers that keep derived tables (the finished-run tally, schedule health) act as the
-- owner (SECURITY DEFINER, migration 0016), so no role needs grants on what they write.
--
-- All are NOLOGIN group roles, and no password appears here. Give each app or host its
-- own login in a group: credentials can then be rotated or revoked one login at a time
-- without touching a single grant. As a superuser:
--
--   CREATE ROLE myapp_migrator LOGIN IN ROLE jobrunner_owner;
--   -- Sessions start as the group, so the tables that migrate creates belong to
--   -- jobrunner_owner (and pick up the default privileges below), not to the login.
--   ALTER ROLE myapp_migrator SET role = 'jobrunner_owner';
--   \password myapp_migrator
--
--   CREATE ROLE myapp_jobs LOGIN IN ROLE jobrunner_worker;       -- the hosts' ticks
--   CREATE ROLE myapp_web LOGIN IN ROLE jobrunner_enqueuer;      -- the app itself
--   CREATE ROLE myapp_monitor LOGIN IN ROLE jobrunner_reader;    -- check, metrics
--   CREATE ROLE alice LOGIN IN ROLE jobrunner_reader, jobrunner_operator;  -- on call
--   \password myapp_jobs   (and each of the others)
--
-- jobrunner's statements name tables without a schema: outside public, also give each
-- login the schema as its search path, e.g.
--   ALTER ROLE myapp_jobs IN DATABASE myapp SET search_path = jobs;
--
-- Roles belong to the whole cluster: databases on one server share these names.

\set ON_ERROR_STOP on
\set QUIET on
\if :{?schema}
\else
    \set schema public
\endif

SET client_min_messages = warning;

BEGIN;

DO $$
DECLARE
    rolename text;
BEGIN
    FOREACH rolename IN ARRAY ARRAY['jobrunner_owner', 'jobrunner_worker', 'jobrunner_enqueuer',
                                'jobrunner_reader', 'jobrunner_operator']
    LOOP
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = rolename) THEN
            EXECUTE format('CREATE ROLE %I NOLOGIN', rolename);
        END IF;
    END LOOP;
END
$$;

-- A connect grant survives a database whose CONNECT was revoked from PUBLIC.
GRANT CONNECT ON DATABASE :"DBNAME"
    TO jobrunner_owner, jobrunner_worker, jobrunner_enqueuer, jobrunner_reader,
       jobrunner_operator;

CREATE SCHEMA IF NOT EXISTS :"schema" AUTHORIZATION jobrunner_owner;
GRANT USAGE, CREATE ON SCHEMA :"schema" TO jobrunner_owner;
GRANT USAGE ON SCHEMA :"schema"
    TO jobrunner_worker, jobrunner_enqueuer, jobrunner_reader, jobrunner_operator;
-- Before PostgreSQL 15 every role may create tables in public, which would hand the others
-- DDL through PUBLIC; this is the revoke PostgreSQL 15 made the default. Roles of other
-- apps that relied on it need their own GRANT CREATE.
REVOKE CREATE ON SCHEMA :"schema"
    FROM PUBLIC, jobrunner_worker, jobrunner_enqueuer, jobrunner_reader, jobrunner_operator;

-- The same for public when jobrunner lives elsewhere: on a database created before
-- PostgreSQL 15 (upgrades keep it), PUBLIC may still create tables there, and every
-- jobrunner role with it. If the revoke cannot be made, say so loudly: their "no DDL"
-- does not hold until someone who owns public revokes it.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_namespace WHERE nspname = 'public')
       AND has_schema_privilege('public', 'public', 'CREATE') THEN
        REVOKE CREATE ON SCHEMA public FROM PUBLIC;
        IF EXISTS (SELECT FROM pg_namespace n, aclexplode(n.nspacl) a
                    WHERE n.nspname = 'public' AND a.grantee = 0
                      AND a.privilege_type = 'CREATE') THEN
            RAISE WARNING 'every role may still create tables in schema public, jobrunner''s '
                'roles included: run REVOKE CREATE ON SCHEMA public FROM PUBLIC as its owner (%)',
                (SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'public');
        END IF;
    END IF;
END
$$;

-- Tables and sequences that jobrunner_owner creates from now on (migrations, this release's
-- and later ones'): the worker gets data access and the reader reads, until this script runs
-- again and sets exactly what each needs. The enqueuer and the operator get nothing by
-- default: their grants are on named tables and columns, below.
ALTER DEFAULT PRIVILEGES FOR ROLE jobrunner_owner IN SCHEMA :"schema"
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO jobrunner_worker;
ALTER DEFAULT PRIVILEGES FOR ROLE jobrunner_owner IN SCHEMA :"schema"
    GRANT SELECT ON TABLES TO jobrunner_reader;
ALTER DEFAULT PRIVILEGES FOR ROLE jobrunner_owner IN SCHEMA :"schema"
    GRANT USAGE, SELECT ON SEQUENCES TO jobrunner_worker;

-- jobrunner's tables migrated by another role (a superuser, the app's own login) become
-- jobrunner_owner's, so migrate can alter them and the grants below cover them. Their
-- indexes and owned sequences follow. Tables of other apps sharing the schema are left alone.
SELECT format('ALTER TABLE %I.%I OWNER TO jobrunner_owner', n.nspname, c.relname)
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = :'schema'
   AND c.relkind IN ('r', 'p')
   AND c.relname IN ('jobrunner_migrations', 'job_definitions', 'job_runs', 'job_attempts',
                     'job_effects', 'job_type_pauses', 'job_audit', 'job_audit_batches',
                     'job_run_tally', 'job_schedule_skips', 'job_schedule_health',
                     'job_run_logs', 'job_type_limits', 'job_rate_windows', 'job_ticks')
   AND c.relowner <> 'jobrunner_owner'::regrole
 ORDER BY c.relname
\gexec

-- And jobrunner's functions: the triggers that act as the owner (SECURITY DEFINER) must act
-- as jobrunner_owner, not as a superuser that happened to migrate.
SELECT format('ALTER FUNCTION %s OWNER TO jobrunner_owner', p.oid::regprocedure)
  FROM pg_proc p
  JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = :'schema'
   AND p.proname LIKE 'jobrunner\_%'
   AND p.proowner <> 'jobrunner_owner'::regrole
 ORDER BY 1
\gexec

-- What each role may do on each of jobrunner's tables: a privilege on the whole table, or
-- (columns) on those columns only, of those the table has: a database migrated by an earlier
-- release, before its `jobrunner migrate`, has not all of them yet. Read with
-- cronjob/queries/: each grant is what a statement of a role's commands needs.
CREATE TEMPORARY TABLE jobrunner_grants (
    relname name, grantee name, privileges text, columns name[]
) ON COMMIT DROP;
INSERT INTO jobrunner_grants VALUES
    ('jobrunner_migrations', 'jobrunner_worker', 'SELECT', NULL),
    ('jobrunner_migrations', 'jobrunner_enqueuer', 'SELECT', NULL),
    ('jobrunner_migrations', 'jobrunner_reader', 'SELECT', NULL),
    ('jobrunner_migrations', 'jobrunner_operator', 'SELECT', NULL),

    ('job_runs', 'jobrunner_worker', 'SELECT, INSERT, UPDATE, DELETE', NULL),
    -- The columns an enqueue writes (cronjob/run_options.py), and those its insert reads
    -- back to learn the id of the run that holds a key (and Django its enqueue time).
    ('job_runs', 'jobrunner_enqueuer', 'INSERT',
     '{id, job_type, payload, run_at, idempotency_key, max_attempts, priority, tenant_id,'
     ' queue, result_id, run_after, traceparent, tracestate, unique_key, created_at,'
     ' updated_at}'),
    -- And whether a run holding a unique key has finished; Django's backend, the result id
    -- of a run that holds its task's unique key.
    ('job_runs', 'jobrunner_enqueuer', 'SELECT',
     '{id, job_type, tenant_id, idempotency_key, unique_key, finished_at, created_at,'
     ' result_id}'),
    ('job_runs', 'jobrunner_reader', 'SELECT', NULL),
    -- What retry, cancel and prune select runs by and change; no payload, no return value.
    ('job_runs', 'jobrunner_operator', 'SELECT',
     '{id, definition_id, job_type, tenant_id, scheduled_for, run_at, status, attempts,'
     ' max_attempts, priority, locked_by, locked_until, last_error, error_type, started_at,'
     ' finished_at, created_at, updated_at}'),
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

    -- Every claim reads the limits, and counts the starts of rate-limited keys.
    ('job_type_limits', 'jobrunner_worker', 'SELECT', NULL),
    ('job_type_limits', 'jobrunner_reader', 'SELECT', NULL),
    ('job_type_limits', 'jobrunner_operator', 'SELECT, INSERT, UPDATE, DELETE', NULL),
    ('job_rate_windows', 'jobrunner_worker', 'SELECT, INSERT, UPDATE', NULL),
    ('job_rate_windows', 'jobrunner_reader', 'SELECT', NULL),
    -- A limit set or cleared forgets the windows counted under the old one.
    ('job_rate_windows', 'jobrunner_operator', 'SELECT, DELETE', NULL),

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

    -- A finalize writes each attempt's run log, and the worker reads what a tick reads and
    -- show; pruning a run deletes its logs through the foreign key's cascade, which acts as
    -- the table's owner.
    ('job_run_logs', 'jobrunner_worker', 'SELECT, INSERT', NULL),
    ('job_run_logs', 'jobrunner_reader', 'SELECT', NULL),

    -- A tick that stays (--listen) enters itself, refreshes and leaves its row, and deletes
    -- the rows of ticks gone for minutes; status, metrics and the dashboard read them.
    ('job_ticks', 'jobrunner_worker', 'SELECT, INSERT, UPDATE, DELETE', NULL),
    ('job_ticks', 'jobrunner_reader', 'SELECT', NULL);

-- A table of jobrunner_owner's that this version does not know (a later release's, before
-- its own roles.sql runs) gets what default privileges give.
INSERT INTO jobrunner_grants
SELECT c.relname, grantee, privileges, NULL
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
 CROSS JOIN (VALUES ('jobrunner_worker', 'SELECT, INSERT, UPDATE, DELETE'),
                    ('jobrunner_reader', 'SELECT')) AS d(grantee, privileges)
 WHERE n.nspname = :'schema'
   AND c.relkind IN ('r', 'p')
   AND c.relowner = 'jobrunner_owner'::regrole
   AND c.relname NOT IN (SELECT relname FROM jobrunner_grants);

-- What exists: exactly these privileges, whatever was granted before. Revoking a table's
-- privileges revokes those on its columns too.
SELECT format('REVOKE ALL ON TABLE %I.%I FROM jobrunner_worker, jobrunner_enqueuer,'
              ' jobrunner_reader, jobrunner_operator', n.nspname, c.relname)
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = :'schema'
   AND c.relkind IN ('r', 'p')
   AND c.relowner = 'jobrunner_owner'::regrole
 ORDER BY c.relname
\gexec

SELECT format('GRANT %s%s ON TABLE %I.%I TO %I', g.privileges,
              CASE WHEN g.columns IS NOT NULL THEN ' (' || present.columns || ')' END,
              n.nspname, c.relname, g.grantee)
  FROM jobrunner_grants g
  JOIN pg_class c ON c.relname = g.relname
  JOIN pg_namespace n ON n.oid = c.relnamespace
  LEFT JOIN LATERAL (
      SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) AS columns
        FROM pg_attribute a
       WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
         AND a.attname = ANY(g.columns)
  ) present ON true
 WHERE n.nspname = :'schema'
   AND c.relkind IN ('r', 'p')
   AND c.relowner = 'jobrunner_owner'::regrole
   AND (g.columns IS NULL OR present.columns IS NOT NULL)
 ORDER BY c.relname, g.grantee, g.privileges
\gexec

-- Sequences: the worker uses them all; the enqueuer draws run ids, the operator the ids of
-- the schedules, attempts and audit entries it writes. (Identity columns need no grant.)
SELECT format('REVOKE ALL ON SEQUENCE %I.%I FROM jobrunner_worker, jobrunner_enqueuer,'
              ' jobrunner_reader, jobrunner_operator', n.nspname, c.relname),
       format('GRANT USAGE, SELECT ON SEQUENCE %I.%I TO jobrunner_worker', n.nspname, c.relname)
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = :'schema'
   AND c.relkind = 'S'
   AND c.relowner = 'jobrunner_owner'::regrole
 ORDER BY c.relname
\gexec

SELECT format('GRANT USAGE ON SEQUENCE %I.%I TO %I', n.nspname, c.relname, s.grantee)
  FROM (VALUES ('job_runs_id_seq', 'jobrunner_enqueuer'),
               ('job_attempts_id_seq', 'jobrunner_operator'),
               ('job_definitions_id_seq', 'jobrunner_operator'),
               ('job_audit_id_seq', 'jobrunner_operator')) AS s(relname, grantee)
  JOIN pg_class c ON c.relname = s.relname
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = :'schema'
   AND c.relkind = 'S'
   AND c.relowner = 'jobrunner_owner'::regrole
 ORDER BY c.relname
\gexec

-- Functions that act as the owner and that only some roles may call: a debounce's
-- replacement of a waiting run (migration 0021), for the roles that enqueue.
SELECT format('GRANT EXECUTE ON FUNCTION %s TO %I', p.oid::regprocedure, f.grantee)
  FROM (VALUES ('jobrunner_replace_waiting', 'jobrunner_enqueuer'),
               ('jobrunner_replace_waiting', 'jobrunner_worker')) AS f(proname, grantee)
  JOIN pg_proc p ON p.proname = f.proname
  JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = :'schema'
 ORDER BY 1
\gexec

COMMIT;

\echo jobrunner_owner, jobrunner_worker, jobrunner_enqueuer, jobrunner_reader and jobrunner_operator are ready in schema :schema of database :DBNAME
