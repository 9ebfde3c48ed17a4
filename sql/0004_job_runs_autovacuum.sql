-- job_runs is a queue: every run is written when it is enqueued, claimed and
-- finished, so it makes dead rows at the rate work flows through it, while the
-- finished history makes it large. With the default (vacuum once a fifth of the
-- table is dead) a table holding a million finished runs would wait for 200,000
-- dead rows, and the dispatch and lease indexes would carry their dead entries
-- that long: vacuum after a fixed amount of churn instead, and keep statistics
-- fresh for the claim's plan.
ALTER TABLE job_runs SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_analyze_threshold = 5000
);
