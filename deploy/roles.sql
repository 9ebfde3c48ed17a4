-- roles.sql: the PostgreSQL roles jobrunner runs as, one per job, each with only what it needs.
--
-- Run it as a superuser in the application's database; -v schema names the schema jobrunner
-- lives in (default public; a schema that does not exist yet is created, owned by
-- jobrunner_owner):
--
--   psql -v schema=public -d myapp -f deploy/roles.sql
--
-- It is idempotent. Run it once before the first `jobrunner migrate`, which needs the
-- roles: each migration gives them, by name, exactly the grants they need on what it creates
-- (jobrunner_role_grants(), migration 0024 and later), revoking what default privileges gave,
-- so every role's grants are exact as soon as `jobrunner migrate` commits, whether or not
-- this script runs again. Running it again (after migrating, or only then, on a database
-- that was migrated earlier) takes ownership of jobrunner's tables and functions if another
-- role created them, and sets the grants again: exactly those of jobrunner_role_grants(),
-- revoking whatever an earlier version of this script or a hand-made grant gave (the
-- worker's writes to schedules and the audit trail, say).
--
-- jobrunner_owner     migrate; trim the audit trail (prune --audit-older-than). Owns the
--                     schema objects.
-- jobrunner_worker    tick: claim, finalize, heartbeat, hand back, rescue, materialize, prune
--                     after the tick, the metrics textfile, pings; and reads what a tick
--                     reads. Reads and writes job_runs, job_attempts, job_effects,
--                     job_run_tally, job_schedule_skips, job_handlers_seen; reads
--                     job_run_logs and inserts the log of an attempt a run made (a trigger
--                     refuses any other); reads and updates job_definitions; reads
--                     job_type_pauses, job_type_limits, job_schedule_health; times starts in
--                     job_rate_arrivals; makes a schedule occurrence's batch and prunes ended
--                     ones (job_batches); reads job_run_dependencies; keeps its tick's row
--                     in job_ticks (every tick; removes those ended a day ago). Nothing of
--                     the audit trail.
-- jobrunner_enqueuer  apps: enqueue(), enqueue_async() and enqueue_many(), `jobrunner enqueue`
--                     (--jsonl too), Django's Task.enqueue(). Inserts into job_runs the
--                     columns an enqueue sets (by COPY too, in bulk), and reads no column
--                     of it: the run that holds a key it names (its id, result id and
--                     enqueue time) only through jobrunner_runs_holding_keys. Replaces a
--                     waiting run's payload and run_at only through jobrunner_replace_waiting
--                     (--unique-key with --replace), for a run of that key's type and
--                     tenant that its own login enqueued. Inserts batches (job_batches, the
--                     columns a batch is made with) and records a run's dependencies only
--                     through jobrunner_runs_wait. Nothing else.
-- jobrunner_reader    status, list, show, metrics, check, audit, limits, schedule list/show/preview,
--                     Django's get_result(). Reads every table but job_effects.
-- jobrunner_operator  retry, cancel, prune, pause, resume, limit, schedule add/pause/resume/
--                     remove/sync, batches, batch show. Reads and updates the bookkeeping
--                     columns of job_runs (never payloads or return values) and deletes runs
--                     and ended batches; reads dependencies; reads and writes
--                     job_definitions, job_type_pauses and job_type_limits; appends to the
--                     audit trail.
--
-- Every role reads jobrunner_migrations (each command checks the schema version); none but
-- the owner can create, alter, drop or truncate anything. The enqueuer reads nothing of
-- job_runs: it cannot list runs, nor learn another tenant's keys or result ids; what it
-- learns of a run it names by type, tenant and key, the insert of
-- cronjob/queries/enqueue.py asks in the same statement. The operator does not read
-- payloads either: give a person who operates jobrunner_reader as well.
--
-- The audit trail (job_audit, job_audit_batches) is append-only for every role but the owner:
-- no role gets UPDATE or DELETE, and a trigger (migration 0016) refuses them to anyone but
-- the owner even if such a grant is given by mistake. The database sets each entry's time
-- and its login (session_user) itself, whatever the INSERT says.
--
-- The triggers that keep derived tables (the finished-run tally, schedule health) act as the
-- owner (SECURITY DEFINER, migration 0016), so no role needs grants on what they write; so do
-- those that end a batch and release a waiting run when a run finishes (migration 0026).
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

-- Tables and sequences that jobrunner_owner creates from now on and that no migration grants
-- by name (jobrunner_role_grants() names every table of this release): the worker gets data
-- access and the reader reads. The enqueuer and the operator get nothing by default. A
-- migration that creates a table narrows these in the same transaction.
ALTER DEFAULT PRIVILEGES FOR ROLE jobrunner_owner IN SCHEMA :"schema"
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO jobrunner_worker;
ALTER DEFAULT PRIVILEGES FOR ROLE jobrunner_owner IN SCHEMA :"schema"
    GRANT SELECT ON TABLES TO jobrunner_reader;
ALTER DEFAULT PRIVILEGES FOR ROLE jobrunner_owner IN SCHEMA :"schema"
    GRANT USAGE, SELECT ON SEQUENCES TO jobrunner_worker;

-- jobrunner's tables migrated by another role (a superuser, the app's own login) become
-- jobrunner_owner's, so migrate can alter them and grant on them. Their
-- indexes and owned sequences follow. Tables of other apps sharing the schema are left alone.
SELECT format('ALTER TABLE %I.%I OWNER TO jobrunner_owner', n.nspname, c.relname)
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = :'schema'
   AND c.relkind IN ('r', 'p')
   AND c.relname IN ('jobrunner_migrations', 'job_definitions', 'job_runs', 'job_attempts',
                     'job_effects', 'job_type_pauses', 'job_audit', 'job_audit_batches',
                     'job_run_tally', 'job_schedule_skips', 'job_schedule_health',
                     'job_run_logs', 'job_type_limits', 'job_rate_windows',
                     'job_rate_arrivals', 'job_handlers_seen', 'job_batches',
                     'job_run_dependencies', 'job_ticks')
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

-- What each role may do on each of jobrunner's tables, sequences and functions: exactly what
-- jobrunner_role_grants() lists (migration 0024, and the later migrations that change the
-- list), whatever was granted before; jobrunner_grant_roles() revokes the rest. Migrations
-- call it themselves, in the transaction that creates a table, so these grants hold as soon
-- as `jobrunner migrate` commits; here it sets them again after ownership changed hands.
-- A database migrated by an earlier release has not the function yet: its grants stay as
-- they are until `jobrunner migrate` runs.
SELECT format('SELECT %I.jobrunner_grant_roles()', :'schema')
 WHERE to_regprocedure(format('%I.jobrunner_grant_roles()', :'schema')) IS NOT NULL
\gexec

COMMIT;

\echo jobrunner_owner, jobrunner_worker, jobrunner_enqueuer, jobrunner_reader and jobrunner_operator are ready in schema :schema of database :DBNAME
