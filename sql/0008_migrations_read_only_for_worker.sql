-- deploy/roles.sql gives jobrunner_worker data access to every table jobrunner_owner
-- creates, through default privileges, and narrows it to reading the migration
-- history only when it runs again after `jobrunner migrate`. Between the two passes
-- (or if the second never ran) the worker could rewrite the history and make
-- migrate skip a migration. The history table is created in the same transaction
-- as this migration runs in on a new database, so it is never writable by the worker.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'jobrunner_worker') THEN
        REVOKE INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER
            ON jobrunner_migrations FROM jobrunner_worker;
    END IF;
END
$$;
