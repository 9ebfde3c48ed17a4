-- Which job types a tick had handlers for, and when last: one row a type. A tick that found
-- work upserts its handler types (once per tick, and only rows older than a few minutes, so
-- a busy minute writes nothing); `status` and the tick's own warning name the types whose
-- runs are due while no tick has had a handler for them recently. Rows of types no tick has
-- handled for 30 days are removed by the same upsert.
CREATE TABLE job_handlers_seen (
    job_type  text PRIMARY KEY,
    host      text NOT NULL,
    seen_at   timestamptz NOT NULL
);

-- The worker records, the reader reads (status): jobrunner_role_grants() (migration 0024)
-- lists it, and the roles of deploy/roles.sql that exist get exactly that now.
SELECT jobrunner_grant_roles();
