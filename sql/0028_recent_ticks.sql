-- Recent ticks (docs/guides/dashboard.md): every run of `jobrunner tick` keeps a row in job_ticks
-- after it ends, with what it did, so the dashboard can say which ticks ran lately, on which
-- hosts, and what each did. Until now the table held the ticks that stay (`tick --listen`),
-- while they ran.
--
-- A tick enters its row in the statement that asks whether there is work (the idle tick's
-- one question, queries.preflight TICK_ENTER): an idle tick's row is written ended, and it
-- asks nothing more. A tick that works fills in its counts when it ends, and the ticks that
-- stay mark their row listening (or polling) while they do. A row whose tick was killed stays
-- open: a listening one is closed as lost by the next listening tick that starts, once it
-- has not been seen for a few minutes; any other is lost once past the time it was bound to
-- end by (ends_by). Ended rows go after a day (each tick's own statements remove a few at a
-- time), or sooner with `tick --prune-older-than`, as do those of lost ticks.
ALTER TABLE job_ticks
    ADD COLUMN ended_at     timestamptz,
    -- Why it ended: 'idle' (nothing to do), NULL for a tick that drained what was due, else
    -- the report's stopped_by ('max-runtime', 'SIGTERM', ...) or 'lost' (killed).
    ADD COLUMN stopped_by   text,
    ADD COLUMN materialized integer,
    ADD COLUMN rescued      integer,
    ADD COLUMN claimed      integer,
    ADD COLUMN succeeded    integer,
    ADD COLUMN failed       integer,
    ADD COLUMN dead         integer,
    -- A tick that does not stay: when it is over at the latest (its --max-runtime and
    -- --grace, and a margin for what it does after them). Open past it, it was killed.
    ADD COLUMN ends_by      timestamptz,
    DROP CONSTRAINT job_ticks_listens_or_polls,
    -- A tick that stays listens or polls, never both; any other tick does neither.
    ADD CONSTRAINT job_ticks_listens_or_polls
        CHECK (listening_since IS NULL OR poll_interval IS NULL),
    ADD CONSTRAINT job_ticks_ended_after_start CHECK (ended_at >= started_at);

-- The rows to remove (ended long enough ago) found without reading the others.
CREATE INDEX job_ticks_ended ON job_ticks ((coalesce(ended_at, ends_by)));

-- The worker writes its tick's row and removes old ones, the reader reads them (status,
-- metrics, the dashboard): the grants of migration 0027 (jobrunner_role_grants()), given
-- again to the roles of deploy/roles.sql that exist.
SELECT jobrunner_grant_roles();
