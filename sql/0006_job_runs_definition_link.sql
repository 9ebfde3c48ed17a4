-- A run's definition_id was a foreign key, checked for every inserted row: a
-- tenant-scoped definition fanning out to 100,000 tenants spent two fifths of
-- its time confirming the same definition 100,000 times. Only materializing
-- writes the link, and it holds the definition's row lock while it does;
-- removing a definition takes that lock first and unlinks the definition's runs
-- itself (store.definition_delete), as ON DELETE SET NULL did. The link cannot
-- point at a definition that is gone.
ALTER TABLE job_runs DROP CONSTRAINT job_runs_definition_id_fkey;
