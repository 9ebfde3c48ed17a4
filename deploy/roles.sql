-- roles.sql: the two PostgreSQL roles jobrunner runs as, each with only what it needs.
--
-- Run it as a superuser in the application's database; -v schema names the schema jobrunner
-- lives in (default public; a schema that does not exist yet is created, owned by
-- jobrunner_owner):
--
--   psql -v schema=public -d myapp -f deploy/roles.sql
--
-- It is idempotent. Run it once before the first `jobrunner migrate`: default privileges
-- then give the worker access to every table and sequence that migrations create, now and
-- in later releases. Run it again after migrating (or run it only then, on a database that
-- was migrated earlier): it grants on what exists, takes ownership of jobrunner's tables if
-- another role created them, and narrows the worker to read-only on jobrunner_migrations,
-- which default privileges cannot single out.
--
-- jobrunner_owner  owns the schema objects and runs `jobrunner migrate` (CREATE on the
--                  schema, owner of every jobrunner table).
-- jobrunner_worker runs everything else (tick, enqueue, status, prune, ...): USAGE on the
--                  schema; SELECT, INSERT, UPDATE, DELETE on jobrunner's tables; USAGE,
--                  SELECT on its sequences; SELECT on jobrunner_migrations, to check the
--                  schema version (never more: migrate revokes the default privileges'
--                  writes on it). No CREATE (CREATE on public is revoked from PUBLIC
--                  too, as PostgreSQL 15 does by default), no TRUNCATE, no DDL.
--
-- Both are NOLOGIN group roles, and no password appears here. Give each app or host its
-- own login in a group: credentials can then be rotated or revoked one login at a time
-- without touching a single grant. As a superuser:
--
--   CREATE ROLE myapp_migrator LOGIN IN ROLE jobrunner_owner;
--   -- Sessions start as the group, so the tables that migrate creates belong to
--   -- jobrunner_owner (and pick up the default privileges below), not to the login.
--   ALTER ROLE myapp_migrator SET role = 'jobrunner_owner';
--   \password myapp_migrator
--
--   CREATE ROLE myapp_jobs LOGIN IN ROLE jobrunner_worker;
--   \password myapp_jobs
--
-- jobrunner's statements name tables without a schema: outside public, also give each
-- login the schema as its search path, e.g.
--   ALTER ROLE myapp_jobs IN DATABASE myapp SET search_path = jobs;
--
-- Roles belong to the whole cluster: databases on one server share these two names.

\set ON_ERROR_STOP on
\set QUIET on
\if :{?schema}
\else
    \set schema public
\endif

SET client_min_messages = warning;

BEGIN;

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'jobrunner_owner') THEN
        CREATE ROLE jobrunner_owner NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'jobrunner_worker') THEN
        CREATE ROLE jobrunner_worker NOLOGIN;
    END IF;
END
$$;

-- A connect grant survives a database whose CONNECT was revoked from PUBLIC.
GRANT CONNECT ON DATABASE :"DBNAME" TO jobrunner_owner, jobrunner_worker;

CREATE SCHEMA IF NOT EXISTS :"schema" AUTHORIZATION jobrunner_owner;
GRANT USAGE, CREATE ON SCHEMA :"schema" TO jobrunner_owner;
GRANT USAGE ON SCHEMA :"schema" TO jobrunner_worker;
-- Before PostgreSQL 15 every role may create tables in public, which would hand the worker
-- DDL through PUBLIC; this is the revoke PostgreSQL 15 made the default. Roles of other
-- apps that relied on it need their own GRANT CREATE.
REVOKE CREATE ON SCHEMA :"schema" FROM PUBLIC, jobrunner_worker;

-- The same for public when jobrunner lives elsewhere: on a database created before
-- PostgreSQL 15 (upgrades keep it), PUBLIC may still create tables there, and the
-- worker with it. If the revoke cannot be made, say so loudly: the worker's "no DDL"
-- does not hold until someone who owns public revokes it.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_namespace WHERE nspname = 'public')
       AND has_schema_privilege('public', 'public', 'CREATE') THEN
        REVOKE CREATE ON SCHEMA public FROM PUBLIC;
        IF EXISTS (SELECT FROM pg_namespace n, aclexplode(n.nspacl) a
                    WHERE n.nspname = 'public' AND a.grantee = 0
                      AND a.privilege_type = 'CREATE') THEN
            RAISE WARNING 'every role may still create tables in schema public, jobrunner_worker '
                'included: run REVOKE CREATE ON SCHEMA public FROM PUBLIC as its owner (%)',
                (SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'public');
        END IF;
    END IF;
END
$$;

-- Tables and sequences that jobrunner_owner creates from now on (migrations, this release's
-- and later ones'): the worker gets data access, nothing more.
ALTER DEFAULT PRIVILEGES FOR ROLE jobrunner_owner IN SCHEMA :"schema"
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO jobrunner_worker;
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
                     'job_effects', 'job_type_pauses', 'job_audit', 'job_run_tally',
                     'job_schedule_skips', 'job_schedule_health')
   AND c.relowner <> 'jobrunner_owner'::regrole
 ORDER BY c.relname
\gexec

-- What already exists: exactly these privileges, whatever was granted before.
SELECT format('REVOKE ALL ON TABLE %I.%I FROM jobrunner_worker', n.nspname, c.relname),
       format('GRANT %s ON TABLE %I.%I TO jobrunner_worker',
              CASE WHEN c.relname = 'jobrunner_migrations' THEN 'SELECT'
                   ELSE 'SELECT, INSERT, UPDATE, DELETE' END,
              n.nspname, c.relname)
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = :'schema'
   AND c.relkind IN ('r', 'p')
   AND c.relowner = 'jobrunner_owner'::regrole
 ORDER BY c.relname
\gexec

SELECT format('REVOKE ALL ON SEQUENCE %I.%I FROM jobrunner_worker', n.nspname, c.relname),
       format('GRANT USAGE, SELECT ON SEQUENCE %I.%I TO jobrunner_worker', n.nspname, c.relname)
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = :'schema'
   AND c.relkind = 'S'
   AND c.relowner = 'jobrunner_owner'::regrole
 ORDER BY c.relname
\gexec

COMMIT;

\echo jobrunner_owner and jobrunner_worker are ready in schema :schema of database :DBNAME
