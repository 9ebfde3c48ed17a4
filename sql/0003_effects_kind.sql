-- The effects ledger learns what kind of record each key is and which attempt
-- wrote it, and gets an index for retention.
--
-- 'once': written by ctx.once() inside the handler's transaction; it exists only
-- if that attempt succeeded, so the effect it guards happened exactly once.
-- 'at_most_once': committed by ctx.at_most_once() on its own, before an effect
-- outside the database; if that attempt then failed (its number is in
-- job_attempts), the effect may not have happened.
ALTER TABLE job_effects
    ADD COLUMN kind text NOT NULL DEFAULT 'once' CHECK (kind IN ('once', 'at_most_once')),
    ADD COLUMN attempt integer;

-- Retention walks the ledger oldest first.
CREATE INDEX job_effects_created ON job_effects (created_at);
