"""Values that flow through a tick: runs, outcomes, decisions, reports."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from uuid import UUID

    from cronjob.runlog import RunLog


class Status(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DEAD = "dead"
    CANCELLED = "cancelled"
    WAITING = "waiting"  # for the runs it was enqueued after (`after=`) to succeed


TERMINAL = frozenset({Status.SUCCEEDED, Status.DEAD, Status.CANCELLED})


# ClaimedRun and Decision are made once per run on the tick's busy path: as named
# tuples they are as immutable as a frozen dataclass at a fifth of the cost.
class ClaimedRun(NamedTuple):
    """A run this tick holds the lease on.

    The claim returns these fields in this order (queries.runs.RUNS_CLAIM_MANY_COLUMNS is
    made from them), all but lease_token, the claim's own; store.runs._claimed_runs reads
    them by position, on the tick's hot path, and names them there too.
    """

    id: int
    job_type: str
    payload: Any
    tenant_id: str | None
    scheduled_for: datetime | None
    attempt: int
    final_attempt: bool  # this attempt used up the budget: an error makes the run dead
    lease_token: UUID
    definition_id: int | None = None  # the schedule that made it, if any (for its pings)
    # The enqueuer's W3C trace context (migration 0018), continued by the attempt's span.
    traceparent: str | None = None
    tracestate: str | None = None
    result_id: UUID | None = None  # a Django task run's result id, for its signals
    priority: int = 0  # with tenant_id, where the tick's next claim goes on round-robin
    run_at: datetime | None = None  # with priority and tenant_id, where its next claim resumes


# Where a tick's next claim resumes: for each (priority, tenant) pair it took runs of since
# its last full claim, the run_at and id of the last one (cronjob/tick/resume.py).
Floors = dict[tuple[int, str], tuple[datetime, int]]


@dataclass(frozen=True)
class Run:
    """A row of job_runs as shown to users."""

    id: int
    definition_id: int | None
    job_type: str
    payload: Any
    tenant_id: str | None
    scheduled_for: datetime | None
    run_at: datetime
    status: Status
    attempts: int
    max_attempts: int
    priority: int
    idempotency_key: str | None
    locked_by: str | None
    locked_until: datetime | None
    last_error: str | None
    error_type: str | None
    started_at: datetime | None
    finished_at: datetime | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class Attempt:
    """A failed attempt, kept so `show` can explain a dead run."""

    attempt: int
    worker: str | None
    error_type: str
    message: str | None
    traceback: str | None
    started_at: datetime | None
    finished_at: datetime


@dataclass(frozen=True)
class AttemptLog:
    """What a handler logged in one attempt (cronjob.runlog), as `show` prints it."""

    attempt: int
    worker: str | None
    outcome: str  # the status the attempt's finalize wrote
    events: list[dict[str, Any]]  # oldest first
    trimmed: int  # older events dropped by the cap
    created_at: datetime


class UnreadablePayload:
    """Stands for a claimed run's payload that Python cannot decode; the run goes dead."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


# What a handler did: exactly one of these comes back from running it.
@dataclass(frozen=True)
class Succeeded:
    pass


@dataclass(frozen=True)
class Errored:
    error_type: str
    message: str
    traceback: str | None = None
    retry_delay: float | None = None  # set by Retry(delay=...)
    permanent: bool = False  # set by Fail(...)


Outcome = Succeeded | Errored


# What the runner will write: built only by the constructors in transitions.py.
class Decision(NamedTuple):
    run: ClaimedRun
    status: Status
    retry_delay: float | None = None
    error: Errored | None = None
    duration: float = 0.0
    logs: RunLog | None = None  # what the handler logged, written with the outcome


# -- operations: what status, metrics, check and prune read and report --


@dataclass(frozen=True)
class RunCell:
    """The runs of one job type in one status, counted at one moment."""

    job_type: str
    status: Status
    runs: int
    due: int  # queued or failed with run_at <= now
    expired_leases: int  # running with locked_until < now: their worker is gone
    oldest_due_at: datetime | None
    last_started_at: datetime | None


@dataclass(frozen=True)
class RunSnapshot:
    """Every RunCell, and the database time they were counted at."""

    now: datetime
    cells: tuple[RunCell, ...]


@dataclass(frozen=True)
class DefinitionSchedule:
    """A definition as `status` lists it: when it fires next."""

    name: str
    job_type: str
    schedule: str
    timezone: str
    enabled: bool
    next_fire_at: datetime | None
    overlap: str = "allow"
    overlap_skips: int = 0  # occurrences the overlap policy did not run


@dataclass(frozen=True)
class DurationSummary:
    """Run times of one job type's recently finished runs, in seconds."""

    job_type: str
    count: int
    total: float
    quantiles: tuple[tuple[float, float], ...]  # (quantile, seconds)


class HolderKind(enum.StrEnum):
    SESSION = "session"
    PREPARED = "prepared transaction"
    SLOT = "replication slot"


@dataclass(frozen=True)
class SnapshotHolder:
    """A transaction or replication slot holding back cleanup (VACUUM's xmin horizon) of the
    queue's database, as the server's views show it to the role that asks."""

    kind: HolderKind
    name: str | None  # a prepared transaction's gid, a slot's name
    pid: int | None  # a session's backend, a slot's walsender
    application_name: str | None
    user: str | None
    state: str | None  # a session's (None: hidden), "prepared", a slot's "active"/"inactive"
    database: str | None  # where it is, when that is not the queue's own database
    xmin_age: int | None  # transactions begun since its snapshot (or transaction id)
    since: datetime | None  # its transaction's start, when prepared, a slot's going inactive
    age: float | None  # seconds since `since`, by the database clock; None: not known
    query: str | None  # a session's query, its start, on one line, without passwords
    visible: bool  # the asking role may see its transaction: its own, or pg_read_all_stats

    @property
    def jobrunner(self) -> bool:
        """One of jobrunner's own sessions: a tick, a command, a handler's ctx.db."""
        return self.kind is HolderKind.SESSION and (self.application_name or "").startswith(
            "jobrunner"
        )


@dataclass(frozen=True)
class HeldLock:
    """One of jobrunner's advisory locks and the session that holds it, as the server's views
    show it to the role that asks (queries.server.SERVER_LIST_ADVISORY_LOCKS)."""

    lock: str  # which: "keyed-batch enqueue", "a key of limited type", ...
    job_type: str | None  # the limited type whose key it is
    pid: int
    user: str | None
    application_name: str | None
    state: str | None  # None: hidden from this role (another login's session)
    age: float | None  # seconds since its transaction began; None: none, or hidden

    @property
    def what(self) -> str:
        """`a key of limited type sms.send`, `keyed-batch enqueue`."""
        return f"{self.lock} {self.job_type}" if self.job_type is not None else self.lock


@dataclass(frozen=True)
class PruneReport:
    """Finished runs deleted, by status."""

    by_status: dict[str, int]
    batches: int
    effects: int = 0  # ledger keys deleted along with their runs

    @property
    def total(self) -> int:
        return sum(self.by_status.values())


@dataclass(frozen=True)
class Definition:
    """A row of job_definitions: a schedule that materializes runs."""

    id: int
    name: str
    job_type: str
    payload: Any
    schedule: str
    timezone: str
    scope: str
    max_attempts: int | None
    priority: int
    catch_up: str
    catch_up_limit: int
    overlap: str
    overlap_skips: int
    expect_within: int | None  # seconds; None: derived from the expression
    ping_url: str | None
    ping_failure_url: str | None
    enabled: bool
    materialized_through: datetime
    next_fire_at: datetime | None
    created_at: datetime
    updated_at: datetime
    then_type: str | None = None  # each occurrence's tenant runs are a batch calling it back


DEFAULT_CATCH_UP_LIMIT = 100  # as the schema's default for job_definitions.catch_up_limit


@dataclass(frozen=True)
class DefinitionSpec:
    """A definition as a user asks for it (add, sync), every field already validated."""

    name: str
    job_type: str
    schedule: str  # the user's text, whitespace collapsed (`@daily` stays `@daily`)
    timezone: str = "UTC"
    payload: Any = field(default_factory=dict)
    scope: str = "global"
    max_attempts: int | None = None
    priority: int = 0
    catch_up: str = "latest"
    catch_up_limit: int = DEFAULT_CATCH_UP_LIMIT
    overlap: str = "allow"
    expect_within: int | None = None
    ping_url: str | None = None
    ping_failure_url: str | None = None  # None: ping_url + "/fail"
    then_type: str | None = None  # each occurrence's batch calls back a run of this type
    enabled: bool | None = None  # None: a new definition is enabled, an existing one unchanged


@dataclass(frozen=True)
class DueDefinition:
    """What materializing needs of a definition that is due: its timing, not its payload."""

    id: int
    name: str
    schedule: str
    timezone: str
    scope: str
    catch_up: str
    catch_up_limit: int
    materialized_through: datetime
    overlap: str = "allow"
    then_type: str | None = None


@dataclass(frozen=True)
class ScheduleHealthRow:
    """A definition's timing and its last outcomes, as `check --stale-schedules` reads them."""

    now: datetime  # the database clock the row was read at
    name: str
    schedule: str
    timezone: str
    scope: str
    enabled: bool
    expect_within: int | None
    created_at: datetime
    updated_at: datetime  # a resume or a change of the definition restarts its window
    last_success_at: datetime | None
    last_success_for: datetime | None
    last_failure_at: datetime | None
    last_failure_for: datetime | None
    last_failure_error: str | None


@dataclass(frozen=True)
class PingTarget:
    """Where a schedule checks in: a URL per outcome."""

    definition_id: int
    name: str
    ping_url: str
    ping_failure_url: str


@dataclass(frozen=True)
class ScheduleSkip:
    """An occurrence a schedule's overlap policy did not run, and why."""

    tenant_id: str | None
    scheduled_for: datetime
    reason: str
    created_at: datetime


@dataclass(frozen=True)
class Advance:
    """What one definition's due occurrences become: runs, and a new high-water mark."""

    definition: DueDefinition
    scheduled_fors: tuple[datetime, ...]  # runs to create, after the catch-up policy
    materialized_through: datetime  # the newest due occurrence, kept or not
    next_fire_at: datetime | None  # None: the schedule never fires again


# -- incidents: selections, paused job types, the audit trail --


@dataclass(frozen=True)
class Selection:
    """Which runs `retry`, `cancel` or `prune` act on: ids, or filters (None: any)."""

    ids: tuple[int, ...] | None = None
    statuses: tuple[str, ...] | None = None
    job_types: tuple[str, ...] | None = None
    tenants: tuple[str, ...] | None = None
    error_types: tuple[str, ...] | None = None
    error_like: str | None = None
    schedule: str | None = None  # a definition's name, as the operator gave it
    definition_id: int | None = None  # that definition, once looked up
    since: datetime | None = None  # last changed (or finished) at or after
    until: datetime | None = None  # last changed (or finished) before
    limit: int | None = None
    batch_id: int | None = None  # members of this batch

    @property
    def filtered(self) -> bool:
        """Whether any filter, as opposed to ids alone, narrows the selection."""
        return any(
            v is not None
            for v in (
                self.statuses,
                self.job_types,
                self.tenants,
                self.error_types,
                self.error_like,
                self.schedule,
                self.since,
                self.until,
                self.batch_id,
            )
        )

    def as_json(self) -> dict[str, object]:
        """The criteria given, as the audit trail records them."""
        shown = {
            "ids": list(self.ids) if self.ids is not None else None,
            "status": list(self.statuses) if self.statuses is not None else None,
            "type": list(self.job_types) if self.job_types is not None else None,
            "tenant": list(self.tenants) if self.tenants is not None else None,
            "error_type": list(self.error_types) if self.error_types is not None else None,
            "error_like": self.error_like,
            "schedule": self.schedule,
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat() if self.until else None,
            "limit": self.limit,
            "batch": self.batch_id,
        }
        return {k: v for k, v in shown.items() if v is not None}


@dataclass(frozen=True)
class SelectionCount:
    """What a selection holds now: runs by status, and the first ids."""

    by_status: dict[str, int]
    sample_ids: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.by_status.values())


@dataclass(frozen=True)
class BatchResult:
    """One batch of a selection: the last id it read, and the runs it changed."""

    last_id: int | None
    ids: tuple[int, ...]
    statuses: tuple[str, ...]  # each changed run's status before the change


@dataclass(frozen=True)
class TypePause:
    """A paused job type: no tick claims its runs until it is resumed."""

    job_type: str
    reason: str | None
    paused_by: str
    paused_at: datetime


@dataclass(frozen=True)
class AuditEntry:
    """One state-changing command, as `jobrunner audit` lists it."""

    id: int
    at: datetime  # the database's clock, whatever the writer said
    actor: str  # who the command said was acting (--actor)
    login: str | None  # the database session_user that wrote it; None before migration 0016
    command: str
    selection: dict[str, object]
    changed: int
    sample_ids: list[int]
    reason: str | None


@dataclass(frozen=True)
class MigrationActivity:
    """What the backend applying a migration does or waits for, as PostgreSQL reports it.

    `phase` and its counts are an index build's (None otherwise); `holder_*` describe the
    session it waits for, if any (its state and age only where this login may see them).
    """

    wait_event_type: str | None
    wait_event: str | None
    phase: str | None
    blocks_done: int | None
    blocks_total: int | None
    tuples_done: int | None
    tuples_total: int | None
    lockers_done: int | None
    lockers_total: int | None
    holder_pid: int | None
    holder_state: str | None
    holder_seconds: float | None


# -- flow control --


@dataclass(frozen=True)
class TypeLimit:
    """A job type's limit (cronjob.limits): at most `concurrency` runs at once and `rate`
    starts per `rate_period` seconds, for the whole type or for each key: a run's tenant
    (`per` 'tenant') or a top-level payload field's value (`per` 'payload', `per_field`)."""

    job_type: str
    concurrency: int | None
    rate: int | None
    rate_period: float | None
    per: str  # 'type', 'tenant' or 'payload'
    per_field: str | None
    reason: str | None = None
    set_by: str = ""
    set_at: datetime | None = None


@dataclass(frozen=True)
class Batch:
    """A batch as `enqueue_batch` made it: its id and its members' run ids, in order."""

    id: int
    run_ids: list[int]


@dataclass(frozen=True)
class BatchState:
    """A batch and how its members ended: what a callback sees as `ctx.batch` (the counts
    as they were when the callback was enqueued) and what `batch show` prints (as they are)."""

    id: int
    on_outcome: str  # 'finished' or 'succeeded'
    then_type: str
    definition_id: int | None  # the schedule whose occurrence it is
    scheduled_for: datetime | None  # that occurrence
    started_at: datetime  # when it was enqueued
    ended_at: datetime | None  # when its last member first ended
    counts: dict[str, int]  # members by status
    not_succeeded: list[int]  # the first hundred members (by id) that did not succeed
    reason: str | None  # why no callback ran (on_outcome 'succeeded')
    callback_run_id: int | None

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def finished(self) -> int:
        return sum(n for status, n in self.counts.items() if status in TERMINAL)
