-- A function resolves the names in its body through the search_path of whoever
-- fires it. The definition-delete trigger named job_runs that way: a session whose
-- search_path put a schema of its own first (any role that can create one, or
-- pg_temp, searched first unless named) would have the trigger update that
-- schema's job_runs instead. Every function jobrunner installs now carries its
-- own search_path: the schema it lives in, then pg_temp, last, so no temporary
-- table can stand in for one of jobrunner's.
DO $$
DECLARE
    fn regprocedure;
    home name;
BEGIN
    FOR fn, home IN
        SELECT p.oid::regprocedure, n.nspname
          FROM pg_proc p
          JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE p.proname IN ('jobrunner_unlink_definition_runs')
           AND n.nspname = current_schema()
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', fn, home);
    END LOOP;
END
$$;
