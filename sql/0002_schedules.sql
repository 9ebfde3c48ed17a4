-- Schedules: the bound of catch-up policy `all`, and the high-water mark's invariant.

-- How many missed occurrences policy `all` may create at most (the newest ones), so a
-- minutely schedule coming back from a month of downtime does not enqueue 43,000 runs.
ALTER TABLE job_definitions
    ADD COLUMN catch_up_limit integer NOT NULL DEFAULT 100
        CHECK (catch_up_limit BETWEEN 1 AND 10000);

-- next_fire_at is the first occurrence after the high-water mark; anything else would make a
-- tick either skip an occurrence or look at a definition that has nothing due.
ALTER TABLE job_definitions
    ADD CONSTRAINT job_definitions_next_fire_after_mark
        CHECK (next_fire_at IS NULL OR next_fire_at > materialized_through);
