-- Operating during incidents: job types paused on every host, and an audit trail of
-- every command that changed state.

-- A paused type is one row. Every claim reads this table (a handful of rows at most)
-- once, to drop paused types from the types it asks for; running runs finish.
CREATE TABLE job_type_pauses (
    job_type   text PRIMARY KEY,
    reason     text,
    paused_by  text NOT NULL,
    paused_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per state-changing command, written in the transaction of (the first batch
-- of) its change, and its count kept up to date as later batches commit.
CREATE TABLE job_audit (
    id          bigserial PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    actor       text NOT NULL,
    command     text NOT NULL,
    selection   jsonb NOT NULL DEFAULT '{}'::jsonb,
    changed     bigint NOT NULL DEFAULT 0 CHECK (changed >= 0),
    sample_ids  bigint[] NOT NULL DEFAULT '{}',
    reason      text
);

CREATE INDEX job_audit_at ON job_audit (at);
