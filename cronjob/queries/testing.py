"""What the pytest plugin (cronjob.testing) asks of the database beside the tick's own
statements: the test's clock pinned, an attempt's savepoint in the test's transaction, and
a run taken for one call of its handler.

Run by cronjob.store.testing.
"""

from __future__ import annotations

from cronjob.queries import _NOW

# The clock of every statement of the transaction (queries._PINNED_CLOCK), `now` or, when it
# is NULL, the clock as it reads now; returned. Local to the transaction, so it ends with the
# test's, or with the savepoint of a Django test it was set in.
CLOCK_PIN = f"SELECT set_config('jobrunner.now', {_NOW}::text, true)::timestamptz"

# An attempt's transaction (its handler's ctx.db) is a savepoint in the test's: released when
# the run's success is recorded in it, rolled back otherwise. Attempts run one at a time.
ATTEMPT_SAVEPOINT = "SAVEPOINT jobrunner_attempt"
# Its end, as a COMMIT would end it: what it wrote stays, and the mark of the handler's
# transaction (queries.runs.HANDLER_TRANSACTION_MARK), which a commit would end, is cleared.
ATTEMPT_SAVEPOINT_RELEASE = (
    "RELEASE SAVEPOINT jobrunner_attempt; SELECT set_config('jobrunner.lease_token', '', true)"
)
ATTEMPT_SAVEPOINT_ROLLBACK = (
    "ROLLBACK TO SAVEPOINT jobrunner_attempt; RELEASE SAVEPOINT jobrunner_attempt"
)

# A run enqueued for one call of its handler, taken as a claim takes a run, under a lease
# token of the caller's.
RUN_TAKE = f"""
UPDATE job_runs
SET status = 'running', finished_at = NULL, attempts = %(attempt)s, max_attempts = %(max_attempts)s,
    locked_by = %(worker)s, locked_until = {_NOW} + make_interval(secs => %(lease)s),
    lease_token = %(token)s, started_at = {_NOW}, updated_at = {_NOW}
WHERE id = %(id)s
RETURNING payload::text, tenant_id, result_id
"""

# ... and gone once the call is over: nothing stays enqueued. Its attempts and logs go with it.
RUN_DELETE = "DELETE FROM job_runs WHERE id = %(id)s"

# The test session's database, made on the server the configured URL names when missing.
SERVER_DATABASE_EXISTS = "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = %(name)s)"
SERVER_DATABASE_CREATE = "CREATE DATABASE {name}"  # an identifier, composed by the store
