"""Materialize: due schedule occurrences become runs, exactly once, however many ticks race.

The first step of every tick. The database clock is read once; occurrences are computed in
Python by `cronjob.cron` (the same code `schedule preview` uses), then written set-based:
per batch of due definitions, one statement creates every global run and moves every
high-water mark, and one `INSERT ... SELECT` per tenant-scoped definition fans out over the
tenant query. Batches are locked with `SKIP LOCKED`, so concurrent ticks share the work
instead of repeating it, and the unique occurrence index makes a duplicate impossible anyway.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cronjob import store
from cronjob.inputs import check_tenants_sql
from cronjob.models import Advance, DueDefinition
from cronjob.text import one_line

# Due definitions locked and written per transaction. A claim batch is bounded by how many
# runs a tick can start at once; this one only by how long its row locks last (tens of
# milliseconds), and larger batches spread each statement's fixed cost over more rows.
# A tick sizes its own batch from its claim batch instead, by the factor below.
MATERIALIZE_BATCH_SIZE = 1000
BATCH_FACTOR = 10  # a tick materializes this many definitions per run it claims at once

NO_TENANT_QUERY = (
    "it is tenant-scoped and no tenant query is configured "
    "(set --tenants-sql or JOBRUNNER_TENANTS_SQL)"
)


@dataclass(frozen=True)
class Problem:
    """A due definition that was left as it was: its occurrences wait for the next tick."""

    definition: str
    reason: str


class Materializer:
    """The tick step that turns due occurrences into runs.

    A due definition that cannot be materialized (tenant-scoped without a tenant query, a
    tenant query that fails, a schedule that no longer parses) keeps its high-water mark, so
    nothing is lost: the next tick tries again and its catch-up policy applies. It is listed
    in `problems`, and the command line exits 1 after the tick did everything else.
    """

    def __init__(
        self,
        *,
        tenants_sql: str | None = None,
        now: datetime | None = None,
        batch_size: int = MATERIALIZE_BATCH_SIZE,
        only: tuple[int, ...] | None = None,
        log: Any = None,
    ) -> None:
        self.tenants_sql = check_tenants_sql(tenants_sql)
        # The definitions this materializer may touch (the demo's own); None: every one.
        self.only = only
        self.now = now
        self.batch_size = batch_size
        self.problems: list[Problem] = []
        self._log = log

    @property
    def log(self) -> Any:
        if self._log is None:
            from cronjob.log import get_logger

            self._log = get_logger()
        return self._log

    def run(self, conn: Any) -> int:
        """Materialize everything due; returns the number of runs created."""
        now, any_due = store.definitions_due_exists(conn, now=self.now)
        if not any_due:
            return 0
        # Definitions left as they were (see `problems`) stay due; skipping them keeps the
        # loop from taking them again in this tick.
        skip: list[int] = []
        evaluations: dict[tuple[str, str], Evaluation | str] = {}
        created = advanced = 0
        while True:
            with conn.transaction():
                batch = store.definitions_claim_due_many(
                    conn, now=now, limit=self.batch_size, skip=skip, only=self.only
                )
                count, written = self._materialize_batch(conn, batch, now, evaluations)
            created += count
            advanced += len(written)
            done = {a.definition.id for a in written}
            skip.extend(d.id for d in batch if d.id not in done)
            if len(batch) < self.batch_size:
                break
        if advanced:
            self.log.info("schedules materialized", runs=created, definitions=advanced)
        return created

    def _materialize_batch(
        self,
        conn: Any,
        batch: Sequence[DueDefinition],
        now: datetime,
        evaluations: dict[tuple[str, str], Evaluation | str],
    ) -> tuple[int, list[Advance]]:
        """Write one locked batch; returns the runs created and the advances written."""
        advances, failed = plan(batch, now, evaluations)
        for definition, reason in failed:
            self._problem(definition, reason)
        return self._write(conn, advances, now)

    def run_now(self, conn: Any, name: str) -> int:
        """One occurrence of the schedule `name` at `now` (the database clock's, unless
        pinned), written as a due one is, under the definition's row lock; its high-water
        mark and next fire time stay as they are. Returns the runs created; a definition
        that cannot be materialized is in `problems`. In the caller's transaction."""
        from cronjob.errors import DefinitionNotFound
        from cronjob.inputs import excerpt

        current = store.definition_get(conn, name, lock=True)
        if current is None:
            raise DefinitionNotFound(f"schedule {excerpt(name)} not found")
        clock = store.clock_now(conn, now=self.now)
        due = DueDefinition(
            id=current.id,
            name=current.name,
            schedule=current.schedule,
            timezone=current.timezone,
            scope=current.scope,
            catch_up=current.catch_up,
            catch_up_limit=current.catch_up_limit,
            materialized_through=current.materialized_through,
            overlap=current.overlap,
        )
        advance = Advance(due, (clock,), current.materialized_through, current.next_fire_at)
        created, _ = self._write(conn, [advance], clock)
        return created

    def _write(
        self, conn: Any, advances: Sequence[Advance], now: datetime
    ) -> tuple[int, list[Advance]]:
        """The runs (and skips) of `advances`, and their marks; returns the runs created and
        the advances written."""
        created = 0
        written = []
        for advance in advances:
            exclusive = advance.definition.overlap != "allow" and advance.scheduled_fors
            if advance.definition.scope != "tenant":
                if exclusive:
                    created += self._write_exclusive(conn, advance, None, now)
                written.append(advance)
            elif self.tenants_sql is None:
                self._problem(advance.definition, NO_TENANT_QUERY)
            elif not advance.scheduled_fors:
                written.append(advance)  # the catch-up policy dropped every occurrence
            else:
                count = self._write_tenants(conn, advance, now, exclusive=bool(exclusive))
                if count is not None:
                    created += count
                    written.append(advance)
        if written:
            global_runs = [
                a
                for a in written
                if a.definition.scope != "tenant" and a.definition.overlap == "allow"
            ]
            created += store.runs_materialize_many(conn, written, global_runs=global_runs, now=now)
        return created, written

    def _write_tenants(
        self, conn: Any, advance: Advance, now: datetime, *, exclusive: bool
    ) -> int | None:
        from cronjob.db import database_errors
        from cronjob.errors import DatabaseError

        assert self.tenants_sql is not None
        try:
            # A savepoint: a failing tenant query must not undo the rest of the batch.
            with database_errors(), conn.transaction():
                if exclusive:
                    return self._write_exclusive(conn, advance, self.tenants_sql, now)
                batches = []
                if advance.definition.then_type is not None:
                    # Each occurrence's runs are a batch: made first, so the runs join it,
                    # and ended after, so an occurrence with no tenant calls back at once.
                    batches = store.batches_insert_for_occurrences(
                        conn, advance.definition, advance.scheduled_fors, now=now
                    )
                created = store.runs_materialize_tenants(
                    conn, advance, tenants_sql=self.tenants_sql, now=now
                )
                for batch_id in batches:
                    store.batch_end(conn, batch_id, now=now)
                return created
        except DatabaseError as exc:
            self._problem(advance.definition, f"the tenant query failed: {exc.description}")
            return None

    def _write_exclusive(
        self, conn: Any, advance: Advance, tenants_sql: str | None, now: datetime
    ) -> int:
        """Runs of a definition under overlap policy skip or queue; skips are recorded."""
        created, skipped = store.runs_materialize_exclusive(
            conn, advance, tenants_sql=tenants_sql, now=now
        )
        if skipped:
            # Recorded in job_schedule_skips and counted on the definition; said here too, so
            # a skipped occurrence is never silent in the tick's own log either.
            self.log.warning(
                "schedule occurrences skipped",
                schedule=advance.definition.name,
                overlap=advance.definition.overlap,
                skipped=skipped,
            )
        return created

    def _problem(self, definition: DueDefinition, reason: str) -> None:
        self.problems.append(Problem(definition.name, reason))
        self.log.error(
            "schedule not materialized",
            schedule=definition.name,
            reason=reason,
            definition_id=definition.id,
        )


def describe_problems(problems: Sequence[Problem]) -> str:
    """One line for the command line's error message; the log has one event per problem."""
    first = problems[0]
    if len({p.definition for p in problems}) == 1:
        return f"schedule {first.definition!r} not materialized: {first.reason}"
    others = len({p.definition for p in problems}) - 1
    return (
        f"{others + 1} schedules not materialized; {first.definition!r}: {first.reason} "
        f"(and {others} more, see the log)"
    )


@dataclass(frozen=True)
class Evaluation:
    """A schedule evaluated at a tick's `now`, shared by every definition that uses it."""

    floor: datetime  # `tail` holds the occurrences in (floor, now], newest `depth` at most
    depth: int
    tail: tuple[datetime, ...]  # ascending
    next_fire_at: datetime | None  # the first occurrence after now

    def covers(self, earliest: datetime, depth: int) -> bool:
        """Whether the newest `depth` occurrences in (earliest, now] are all in `tail`."""
        # A full tail is the newest occurrences whatever the floor; a short one is every
        # occurrence since its floor.
        return depth <= self.depth and (len(self.tail) == self.depth or earliest >= self.floor)


def plan(
    batch: Sequence[DueDefinition],
    now: datetime,
    evaluations: dict[tuple[str, str], Evaluation | str] | None = None,
) -> tuple[list[Advance], list[tuple[DueDefinition, str]]]:
    """Decide, for each due definition, which runs to create and where its mark moves.

    Pure but for `evaluations`, a cache the caller keeps for one `now` (a tick passes the
    same one to every batch). Definitions sharing a schedule and timezone share one
    evaluation: a backward walk from `now` and one step forward. Their marks may differ;
    each takes the occurrences after its own. That is what keeps ten thousand due
    definitions cheap: they fire together because they share a handful of schedules.
    Returns the advances and the definitions whose schedule could not be evaluated.
    """
    from cronjob import cron

    # Fire times are UTC datetimes; compared with datetimes in the session's zone, as the
    # database hands them out, each comparison would ask that zone for its offset again.
    now = now.astimezone(UTC)
    cache = {} if evaluations is None else evaluations
    groups: dict[tuple[str, str], list[DueDefinition]] = defaultdict(list)
    for definition in batch:
        groups[(definition.schedule, definition.timezone)].append(definition)
    advances: list[Advance] = []
    failed: list[tuple[DueDefinition, str]] = []
    for key, members in groups.items():
        earliest = min(d.materialized_through for d in members).astimezone(UTC)
        depth = max(d.catch_up_limit if d.catch_up == "all" else 1 for d in members)
        evaluation = cache.get(key)
        if evaluation is None or (
            isinstance(evaluation, Evaluation) and not evaluation.covers(earliest, depth)
        ):
            evaluation = cache[key] = _evaluate(key[0], key[1], earliest, now, depth)
        if isinstance(evaluation, str):
            failed.extend((d, evaluation) for d in members)
            continue
        for definition in members:
            due = [t for t in evaluation.tail if t > definition.materialized_through]
            chosen = cron.apply_catch_up(
                due, definition.catch_up, now, bound=definition.catch_up_limit
            )
            advances.append(
                Advance(
                    definition=definition,
                    scheduled_fors=tuple(chosen),
                    # The newest due occurrence, even when the policy dropped it: dropped
                    # occurrences must never be considered again.
                    materialized_through=due[-1] if due else definition.materialized_through,
                    next_fire_at=evaluation.next_fire_at,
                )
            )
    return advances, failed


def _evaluate(
    expression: str, timezone: str, earliest: datetime, now: datetime, depth: int
) -> Evaluation | str:
    """The schedule's newest `depth` occurrences after `earliest`, or why it cannot be used."""
    from cronjob import cron

    try:
        # Usually a definition has one or a few occurrences due: a single walk forward from
        # the oldest mark finds them and the next one. After a long stop it would have to
        # pass every missed occurrence, so then walk back from `now` instead.
        ahead = cron.next_after(expression, timezone, earliest, depth + 1)
        if len(ahead) <= depth or ahead[-1] > now:
            tail = [t for t in ahead if t <= now]
            upcoming = [t for t in ahead if t > now][:1]
        else:
            tail = cron.latest_occurrences(expression, timezone, earliest, now, depth)
            upcoming = cron.next_after(expression, timezone, now)
    except cron.CronError as exc:
        return str(exc)
    except Exception as exc:
        # A definition written by someone else's SQL can hold anything (a field of
        # thousands of digits, a zone since removed): it is reported and skipped, and
        # never stops the others or the tick.
        message = one_line(str(exc))[:200]
        return f"its schedule cannot be evaluated ({type(exc).__name__}: {message})"
    return Evaluation(earliest, depth, tuple(tail), upcoming[0] if upcoming else None)
