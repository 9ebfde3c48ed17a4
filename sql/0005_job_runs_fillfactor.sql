-- Finished runs stay in job_runs, packed into pages with a few dozen bytes to
-- spare. At the default fillfactor of 100 new runs are written into those
-- leftovers, one per page across the whole history, and every claim and finish
-- then dirties (and after each checkpoint logs in full) one page per run: with a
-- million finished runs a drain cost about a third more. Pages keep a tenth free
-- for updates instead, so new runs go to pages with room for many of them.
ALTER TABLE job_runs SET (fillfactor = 90);
