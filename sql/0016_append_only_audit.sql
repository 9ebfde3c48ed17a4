-- The audit trail can no longer be rewritten by those it records, and each role of
-- deploy/roles.sql needs grants only on what its own statements touch.

-- Who wrote an entry, as the database knows it: the session's login (session_user), beside
-- the actor the command declared (--actor, JOBRUNNER_ACTOR), which anyone can type. NULL
-- for the entries recorded before this migration. `at` keeps its name and becomes the
-- database's own clock: both are set by the trigger below, whatever the INSERT says.
ALTER TABLE job_audit ADD COLUMN login text;

-- A command that changes runs batch by batch wrote one entry with its first batch and then
-- updated its count as later batches committed. With entries append-only, each later batch
-- appends a row here instead, in its own transaction; `jobrunner audit` shows an entry with
-- the runs of all its batches, and its first sample ids.
CREATE TABLE job_audit_batches (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    audit_id    bigint NOT NULL REFERENCES job_audit (id) ON DELETE CASCADE,
    at          timestamptz NOT NULL,
    login       text NOT NULL,
    changed     bigint NOT NULL CHECK (changed >= 0),
    sample_ids  bigint[] NOT NULL DEFAULT '{}'
);
CREATE INDEX job_audit_batches_entry ON job_audit_batches (audit_id, id);

CREATE FUNCTION jobrunner_audit_stamp() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.at := now();
    NEW.login := session_user;
    RETURN NEW;
END
$$;

-- A batch belongs to an entry its own login recorded: no one adds runs to another's entry.
-- Reads the entry as the table's owner (SECURITY DEFINER), which leaves session_user as it
-- was: the role writing the batch needs no right to read the trail.
CREATE FUNCTION jobrunner_audit_batch_stamp() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    NEW.at := now();
    NEW.login := session_user;
    IF NOT EXISTS (SELECT 1 FROM job_audit WHERE id = NEW.audit_id AND login = session_user) THEN
        RAISE EXCEPTION 'permission denied: audit entry % was not recorded by %',
            NEW.audit_id, session_user USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER job_audit_stamp BEFORE INSERT ON job_audit
    FOR EACH ROW EXECUTE FUNCTION jobrunner_audit_stamp();
CREATE TRIGGER job_audit_batches_stamp BEFORE INSERT ON job_audit_batches
    FOR EACH ROW EXECUTE FUNCTION jobrunner_audit_batch_stamp();

-- Append-only for all but the tables' owner (and the roles that act as it: its members,
-- superusers), who alone trims the trail (`prune --audit-older-than`). roles.sql grants no
-- other role UPDATE or DELETE; this holds even if a grant is given by mistake. It runs as
-- the caller (no SECURITY DEFINER): current_user is whoever asks.
CREATE FUNCTION jobrunner_audit_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    table_owner oid := (SELECT relowner FROM pg_class WHERE oid = TG_RELID);
BEGIN
    IF NOT pg_has_role(current_user, table_owner, 'USAGE') THEN
        RAISE EXCEPTION 'permission denied for table %: the audit trail is append-only, '
            'and only its owner (%) may % it', TG_TABLE_NAME, pg_get_userbyid(table_owner),
            lower(TG_OP) USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER job_audit_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON job_audit
    FOR EACH STATEMENT EXECUTE FUNCTION jobrunner_audit_append_only();
CREATE TRIGGER job_audit_batches_append_only
    BEFORE UPDATE OR DELETE OR TRUNCATE ON job_audit_batches
    FOR EACH STATEMENT EXECUTE FUNCTION jobrunner_audit_append_only();

-- Until roles.sql runs again, the grants that default privileges and earlier versions of it
-- gave stay: take back at once what would let the worker (or any jobrunner role) change
-- the trail or write to it, as 0008 does for the migration history.
DO $$
DECLARE
    grantee text;
BEGIN
    FOREACH grantee IN ARRAY ARRAY['jobrunner_worker', 'jobrunner_enqueuer', 'jobrunner_reader',
                                   'jobrunner_operator']
    LOOP
        IF EXISTS (SELECT FROM pg_roles WHERE rolname = grantee) THEN
            EXECUTE format('REVOKE UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER'
                           ' ON job_audit, job_audit_batches FROM %I', grantee);
            IF grantee <> 'jobrunner_operator' THEN
                EXECUTE format('REVOKE INSERT ON job_audit, job_audit_batches FROM %I', grantee);
            END IF;
        END IF;
    END LOOP;
END
$$;

-- The triggers that keep derived tables (the finished-run tally, schedule health) and unlink
-- a removed schedule's runs now act as the tables' owner: an enqueuer's insert, an operator's
-- retry or a schedule's removal needs no grant on what the trigger writes.
ALTER FUNCTION jobrunner_tally_inserted_runs() SECURITY DEFINER;
ALTER FUNCTION jobrunner_tally_updated_runs() SECURITY DEFINER;
ALTER FUNCTION jobrunner_tally_deleted_runs() SECURITY DEFINER;
ALTER FUNCTION jobrunner_tally_truncated_runs() SECURITY DEFINER;
ALTER FUNCTION jobrunner_note_schedule_outcome() SECURITY DEFINER;
ALTER FUNCTION jobrunner_forget_schedule_health() SECURITY DEFINER;
ALTER FUNCTION jobrunner_unlink_definition_runs() SECURITY DEFINER;

-- As every function jobrunner installs (see 0007, 0010): names resolve in its own schema,
-- then pg_temp, last, whatever the search_path of the session that fires it; for a SECURITY
-- DEFINER function above all.
SELECT jobrunner_pin_search_paths();
