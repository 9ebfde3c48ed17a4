-- jobrunner: no transaction
-- An idempotency key is unique per (job type, tenant), as the contract says: a key that
-- another job type or tenant holds belongs to another piece of work, which no longer
-- blocks this one's use of it (nor names its run to the caller). Runs without a tenant
-- are a tenant of their own: '' in the index, as PostgreSQL 13 has no NULLS NOT DISTINCT.
-- The insert's ON CONFLICT names this same expression (queries.runs), and so must every
-- statement that looks a key up, to walk this index.
--
-- Built concurrently, outside a transaction (cronjob/migrate.py): job_runs takes writes
-- all along, however long the build over its history takes. The old index goes once the
-- new one is valid, and is dropped concurrently too; between the two, both hold.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS job_runs_idempotency_key_per_work
    ON job_runs (job_type, (coalesce(tenant_id, '')), idempotency_key)
    WHERE idempotency_key IS NOT NULL;

DROP INDEX CONCURRENTLY IF EXISTS job_runs_idempotency_key;
