"""Every SQL statement jobrunner runs but the migration files, named entity-verb-qualifier.

One module per table or concern, each run by the store module of the same name
(`queries.runs.RUNS_CLAIM_MANY` by `store.runs.runs_claim_many`):

| module        | its statements                                                          |
|---------------|-------------------------------------------------------------------------|
| `preflight`   | what an idle tick and migrate ask: is there work, the migrations, waits |
| `enqueue`     | a run's enqueue: insert (or find who holds its key), bulk copy, replace |
| `runs`        | a run's life: claim, finalize, heartbeat, hand back, rescue, read,      |
|               | retry and cancel by id, the handler's transaction, prune                |
| `definitions` | schedules: definitions, materializing, health, pings, skips, sync lock  |
| `incidents`   | an operator's selections of runs, paused job types, the audit trail     |
| `limits`      | job type limits: set, cleared, listed, what they hold back              |
| `listen`      | what a listening tick and `wait` ask while they wait; the listening     |
|               | ticks                                                                   |
| `effects`     | the effects ledger                                                      |
| `tasks`       | Django's Tasks backend                                                  |
| `tally`       | status and metrics: the snapshot, the finished-run tally, durations     |
| `dashboard`   | the dashboard's pages of runs and of the audit trail, its charts        |
| `server`      | the server's own: what holds back cleanup, whether a session writes     |
| `batches`     | batches: made, ended, read, their members, pruned                       |
| `dependencies`| the runs a run waits for: recorded at its enqueue, read                 |
| `testing`     | the pytest plugin's: the test's clock, an attempt's savepoint           |

This module holds only the fragments several of them share, each written once: a
fragment that guards correctness (the lease fence, the lease release) is named here
and reused, never typed again. An idle tick imports it with `preflight`, so it
stays a handful of strings.

Time-dependent statements take an optional `now` parameter so tests can drive the
clock; in production it is NULL and the database clock decides. A session may pin the
clock of every statement it runs, those of code that passes no `now` (an app's enqueue, a
framework's) included, with the setting `jobrunner.now` (`_PINNED_CLOCK`): the pytest
plugin's clock (cronjob.testing) is that setting, local to the test's transaction.
"""

from __future__ import annotations

# The clock the session pinned, if it did: NULL when `jobrunner.now` was never set, and ''
# (NULL here too) once the transaction that set it locally is over. Read inline, not
# through a function of a migration's: a function call costs the claim's update a few
# times more per row, and a subquery more to plan than the claim saves.
_PINNED_CLOCK = "nullif(current_setting('jobrunner.now', true), '')::timestamptz"
_NOW = f"coalesce(%(now)s::timestamptz, {_PINNED_CLOCK}, now())"
# For statements that may run late in a longer transaction (a success recorded in
# the handler's own ctx.db transaction): now() would be when that transaction began.
_STATEMENT_NOW = f"coalesce(%(now)s::timestamptz, {_PINNED_CLOCK}, statement_timestamp())"


# Ended rows of job_ticks older than `kept` seconds (and those of ticks that do not stay,
# killed, as old past their ends_by), a few at a time (job_ticks_ended): each
# tick's own statement removes what the ticks of a day ago left, so the table holds about a
# day of ticks without a step of its own. A CTE of preflight TICK_ENTER and listen TICKS_END.
_TICKS_GONE = f"""
gone AS (
    DELETE FROM job_ticks WHERE id IN (
        SELECT id FROM job_ticks
        WHERE coalesce(ended_at, ends_by) < {_NOW} - make_interval(secs => %(kept)s)
        ORDER BY coalesce(ended_at, ends_by) LIMIT 10)
)"""


def _claimable(job_types: str, *, limited: bool = True) -> str:
    """The tick's job types less the paused ones (job_type_pauses), as an array; without
    `limited`, less the types with a limit too (job_type_limits), which only the claim's
    limited part takes (jobrunner_claimable_limited, migration 0021).

    An uncorrelated subquery: PostgreSQL evaluates it once per statement, and the
    claim's scan then compares each row against the shorter array, as it did before.
    """
    unlimited = (
        "" if limited else " AND NOT EXISTS (SELECT 1 FROM job_type_limits l WHERE l.job_type = t)"
    )
    return (
        f"ARRAY(SELECT t FROM unnest({job_types}::text[]) AS t"
        f" WHERE NOT EXISTS (SELECT 1 FROM job_type_pauses p WHERE p.job_type = t){unlimited})"
    )


# The one rule for failed or dead: an attempt that used up its run's budget is the
# final one. The claim hands its verdict to the runner's decision
# (ClaimedRun.final_attempt, read by transitions.decide) and rescue applies it to
# the runs it recovers, so the two can never disagree. Columns are unqualified:
# both statements read them from the only relation that has them.
_FINAL_ATTEMPT = "attempts >= coalesce(max_attempts, 1)"


def _lease_fence(token: str, run: str | None = None) -> str:
    """The lease fence: a write by a run's worker applies only while the run is still
    running under that worker's lease token (`token`, a parameter or a column).

    A worker that lost its lease (stalled, cancelled, rescued, re-claimed) can then
    never overwrite a newer outcome. `run` qualifies the run's columns, in a statement
    where another relation has columns of the same names.
    """
    row = f"{run}." if run else ""
    return f"{row}lease_token = {token} AND {row}status = 'running'"


# The lease release: whatever ends or interrupts an attempt (finalize, hand back,
# rescue, an operator's retry or cancel) clears all three together, so a run is never
# left half held, and the worker that held it is fenced out from then on.
_LEASE_RELEASE = "locked_by = NULL, locked_until = NULL, lease_token = NULL"

# What retry and cancel do to a run (`t` is its row as locked before the change), whether
# it was named by id (queries.runs) or picked by a selection (queries.incidents): the same
# change either way. retry: due now, lock cleared; dead and cancelled runs get a fresh
# attempt budget.
_RETRY_SET = f"""
    SET status = CASE WHEN t.status IN ('dead', 'cancelled') OR r.attempts = 0
                      THEN 'queued' ELSE 'failed' END,
        attempts = CASE WHEN t.status IN ('dead', 'cancelled') THEN 0 ELSE r.attempts END,
        run_at = {_NOW},
        finished_at = NULL,
        {_LEASE_RELEASE},
        updated_at = {_NOW}
"""
_CANCEL_SET = f"""
    SET status = 'cancelled', finished_at = {_NOW},
        {_LEASE_RELEASE},
        updated_at = {_NOW}
"""

# A retry takes a running run from its worker, whose attempt then never reports back: the
# retry records it, as rescue records a lost one, so `show` tells what became of it. Its
# number stays the run's, and the next claim's attempt follows it. A CTE of the retry,
# after `target` (the runs as locked, with the columns of _RETRY_LOCKED) and `changed`.
_RETRY_LOCKED = "id, status, attempts, locked_by, started_at"
_RETRY_SUPERSEDED = f"""
superseded AS (
    INSERT INTO job_attempts (run_id, attempt, worker, error_type, message, started_at,
                              finished_at)
    SELECT t.id, t.attempts, t.locked_by, 'retried',
           'superseded by an operator''s retry while the worker '
           || coalesce(t.locked_by, '?') || ' was running it',
           t.started_at, {_NOW}
    FROM target t JOIN changed c USING (id)
    WHERE t.status = 'running'
)"""


# Each entry with the runs of all its batches, and its first sample ids across them: an
# entry as models.AuditEntry has it, whoever lists it (`jobrunner audit`, the dashboard).
_AUDIT_ENTRIES = """
SELECT a.id, a.at, a.actor, a.login, a.command, a.selection,
       a.changed + coalesce(later.changed, 0) AS changed,
       (a.sample_ids || coalesce(later.sample_ids, '{}'))[1:%(sample)s] AS sample_ids,
       a.reason
FROM job_audit a
LEFT JOIN LATERAL (
    SELECT sum(b.changed)::bigint AS changed,
           (SELECT array_agg(sample.id ORDER BY b2.id, sample.n)
            FROM job_audit_batches b2, unnest(b2.sample_ids) WITH ORDINALITY AS sample(id, n)
            WHERE b2.audit_id = a.id) AS sample_ids
    FROM job_audit_batches b
    WHERE b.audit_id = a.id
) later ON true
"""
