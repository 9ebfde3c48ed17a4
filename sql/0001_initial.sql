-- Core schema: definitions, runs, failed-attempt history.
-- Statuses are text with CHECK constraints rather than an enum type so later
-- migrations can add states without ALTER TYPE (which cannot run in a transaction
-- on older servers).

CREATE TABLE job_definitions (
    id                   bigserial PRIMARY KEY,
    name                 text NOT NULL UNIQUE,
    job_type             text NOT NULL,
    payload              jsonb NOT NULL DEFAULT '{}'::jsonb,
    schedule             text NOT NULL,
    timezone             text NOT NULL DEFAULT 'UTC',
    scope                text NOT NULL DEFAULT 'global' CHECK (scope IN ('global', 'tenant')),
    max_attempts         integer CHECK (max_attempts >= 1),
    priority             integer NOT NULL DEFAULT 0,
    catch_up             text NOT NULL DEFAULT 'latest' CHECK (catch_up IN ('latest', 'all', 'none')),
    enabled              boolean NOT NULL DEFAULT true,
    -- High-water mark: the last occurrence already materialized (or the creation
    -- time). Advanced in the same transaction that inserts the runs, so pruning
    -- runs or a host clock stepping back can never re-create an occurrence.
    materialized_through timestamptz NOT NULL DEFAULT now(),
    -- Next occurrence after materialized_through, kept so a tick finds due
    -- definitions with an index scan instead of evaluating every cron expression.
    next_fire_at         timestamptz,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX job_definitions_due ON job_definitions (next_fire_at) WHERE enabled;

CREATE TABLE job_runs (
    id               bigserial PRIMARY KEY,
    definition_id    bigint REFERENCES job_definitions (id) ON DELETE SET NULL,
    job_type         text NOT NULL,
    payload          jsonb NOT NULL DEFAULT '{}'::jsonb,
    tenant_id        text,
    scheduled_for    timestamptz,
    run_at           timestamptz NOT NULL DEFAULT now(),
    status           text NOT NULL DEFAULT 'queued'
                     CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'dead', 'cancelled')),
    attempts         integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    -- NULL until first claimed: then the handler's default is written in, so an
    -- enqueue from a shell that has no handlers loaded still gets the handler's budget.
    max_attempts     integer CHECK (max_attempts >= 1),
    priority         integer NOT NULL DEFAULT 0,
    idempotency_key  text,
    locked_by        text,
    locked_until     timestamptz,
    lease_token      uuid,
    last_error       text,
    error_type       text,
    started_at       timestamptz,
    finished_at      timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    -- A finish time exists exactly when the run is terminal.
    CONSTRAINT job_runs_finished_iff_terminal
        CHECK ((finished_at IS NOT NULL) = (status IN ('succeeded', 'dead', 'cancelled'))),
    -- A lease exists exactly when the run is running.
    CONSTRAINT job_runs_leased_iff_running
        CHECK ((status = 'running') = (lease_token IS NOT NULL AND locked_until IS NOT NULL))
);

-- Dispatch: the claim's filter and order, over runnable rows only, so finding the
-- next run stays a short range scan however many finished rows the table holds.
CREATE INDEX job_runs_dispatch ON job_runs (priority, run_at, id)
    WHERE status IN ('queued', 'failed');

-- Rescue: running runs whose lease expired.
CREATE INDEX job_runs_leases ON job_runs (locked_until) WHERE status = 'running';

-- Partial: most runs have no key, and every status change would otherwise
-- maintain an index entry for a NULL.
CREATE UNIQUE INDEX job_runs_idempotency_key ON job_runs (idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- Exactly one run per (definition, occurrence, tenant), whatever number of ticks race.
CREATE UNIQUE INDEX job_runs_occurrence
    ON job_runs (definition_id, scheduled_for, (coalesce(tenant_id, '')))
    WHERE definition_id IS NOT NULL;

-- Pruning and listing finished runs by age.
CREATE INDEX job_runs_finished ON job_runs (finished_at) WHERE finished_at IS NOT NULL;

CREATE TABLE job_attempts (
    id           bigserial PRIMARY KEY,
    run_id       bigint NOT NULL REFERENCES job_runs (id) ON DELETE CASCADE,
    attempt      integer NOT NULL,
    worker       text,
    error_type   text NOT NULL,
    message      text,
    traceback    text,
    started_at   timestamptz,
    finished_at  timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX job_attempts_run ON job_attempts (run_id, attempt);

-- The effects ledger: a business key recorded in the handler's own transaction,
-- so a side effect in the database happens once however often its run is retried.
CREATE TABLE job_effects (
    key         text PRIMARY KEY,
    run_id      bigint,
    created_at  timestamptz NOT NULL DEFAULT now()
);
