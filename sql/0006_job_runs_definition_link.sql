-- A run's definition_id was a foreign key, checked for every inserted row: a
-- tenant-scoped definition fanning out to 100,000 tenants spent two fifths of
-- its time confirming the same definition 100,000 times. Only materializing
-- writes the link, and it holds the definition's row lock while it does. A
-- definition's delete waits for that lock, and this trigger then unlinks its
-- runs, as ON DELETE SET NULL did: its UPDATE takes a fresh snapshot, so it
-- sees every run a tick committed before the lock was granted. Deletes are rare;
-- inserts no longer pay anything for the link.
ALTER TABLE job_runs DROP CONSTRAINT job_runs_definition_id_fkey;

CREATE FUNCTION jobrunner_unlink_definition_runs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE job_runs SET definition_id = NULL WHERE definition_id = OLD.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER job_definitions_unlink_runs
    AFTER DELETE ON job_definitions
    FOR EACH ROW EXECUTE FUNCTION jobrunner_unlink_definition_runs();
