"""How the queue is doing, read off one snapshot: per job type, overall, and against
the thresholds `jobrunner check` enforces.

Pure functions over values from the store, so what `status`, `metrics` and
`check` report is decided once and agrees between them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cronjob.models import RunCell, RunSnapshot, Status, TypeLimit, TypePause

DEFAULT_UNCLAIMED_AFTER = 600.0
# A pause's reason may be up to a thousand characters; the lines that name a paused type
# show its start.
PAUSE_REASON_CHARS = 200


@dataclass(frozen=True)
class TypeHealth:
    """One job type: its runs by status, what is due, and what looks wrong."""

    job_type: str
    by_status: dict[str, int]  # every status, zero included
    due: int
    expired_leases: int
    oldest_due_at: datetime | None
    oldest_due_age: float | None  # seconds the oldest due run has waited
    last_started_at: datetime | None

    @property
    def dead(self) -> int:
        return self.by_status[Status.DEAD.value]


@dataclass(frozen=True)
class Overview:
    """Every job type's health at one moment of the database clock."""

    now: datetime
    types: tuple[TypeHealth, ...]
    # Paused job types wait by design: their due runs are neither a queue-age breach
    # nor unclaimed.
    paused: tuple[TypePause, ...] = ()
    # Limited job types (flow control). Their due runs wait for a place or a window when the
    # limit is why: then they are throttled, which is neither a queue-age breach nor unclaimed.
    limits: tuple[TypeLimit, ...] = ()

    @property
    def paused_types(self) -> frozenset[str]:
        return frozenset(p.job_type for p in self.paused)

    @property
    def throttled(self) -> tuple[TypeLimit, ...]:
        """The limits holding due runs back now: a type with due runs, and with runs in
        flight under a concurrency limit or a rate limit counting its starts."""
        by_type = {t.job_type: t for t in self.types}
        held = []
        for limit in self.limits:
            health = by_type.get(limit.job_type)
            if health is None or not health.due or limit.job_type in self.paused_types:
                continue
            if limit.rate is not None or health.by_status[Status.RUNNING.value]:
                held.append(limit)
        return tuple(held)

    @property
    def throttled_types(self) -> frozenset[str]:
        return frozenset(limit.job_type for limit in self.throttled)

    @property
    def waiting_by_design(self) -> frozenset[str]:
        """Types whose due runs wait as they were told to: paused, or throttled."""
        return self.paused_types | self.throttled_types

    @property
    def by_status(self) -> dict[str, int]:
        return {s.value: sum(t.by_status[s.value] for t in self.types) for s in Status}

    @property
    def total(self) -> int:
        return sum(self.by_status.values())

    @property
    def due(self) -> int:
        return sum(t.due for t in self.types)

    @property
    def expired_leases(self) -> int:
        return sum(t.expired_leases for t in self.types)

    @property
    def dead(self) -> int:
        return sum(t.dead for t in self.types)

    @property
    def oldest_due(self) -> TypeHealth | None:
        """The type whose due run has waited longest, if anything is due (paused and
        throttled types aside)."""
        paused = self.waiting_by_design
        waiting = [
            t for t in self.types if t.oldest_due_age is not None and t.job_type not in paused
        ]
        return max(waiting, key=lambda t: t.oldest_due_age or 0.0) if waiting else None

    @property
    def oldest_due_age(self) -> float | None:
        oldest = self.oldest_due
        return oldest.oldest_due_age if oldest else None

    def unclaimed(self, after: float = DEFAULT_UNCLAIMED_AFTER) -> list[TypeHealth]:
        """Job types nobody is working on.

        A type is unclaimed when one of its runs has been due for longer than
        `after` seconds and no run of that type has started within those
        `after` seconds: no tick has a handler for it (module not loaded,
        `--types` leaves it out) or every worker that has one is down or busy.
        """
        since = self.now - timedelta(seconds=after)
        paused = self.waiting_by_design
        return [
            t
            for t in self.types
            if t.job_type not in paused
            and t.oldest_due_age is not None
            and t.oldest_due_age > after
            and (t.last_started_at is None or t.last_started_at < since)
        ]


def read_overview(conn: Any, *, now: datetime | None = None) -> Overview:
    """The queue's overview as `status`, `check` and the metrics show it: runs, pauses and
    limits."""
    from cronjob import store

    return summarize(
        store.runs_snapshot(conn, now=now),
        tuple(store.job_type_pauses_list(conn)),
        tuple(store.job_type_limits_list(conn)),
    )


def summarize(
    snapshot: RunSnapshot, paused: tuple[TypePause, ...] = (), limits: tuple[TypeLimit, ...] = ()
) -> Overview:
    cells_by_type: dict[str, list[RunCell]] = {}
    for cell in snapshot.cells:
        cells_by_type.setdefault(cell.job_type, []).append(cell)
    types = []
    for job_type in sorted(cells_by_type):
        cells = cells_by_type[job_type]
        by_status = {s.value: 0 for s in Status}
        for cell in cells:
            by_status[cell.status.value] = cell.runs
        due_times = [c.oldest_due_at for c in cells if c.oldest_due_at is not None]
        started = [c.last_started_at for c in cells if c.last_started_at is not None]
        oldest = min(due_times) if due_times else None
        types.append(
            TypeHealth(
                job_type=job_type,
                by_status=by_status,
                due=sum(c.due for c in cells),
                expired_leases=sum(c.expired_leases for c in cells),
                oldest_due_at=oldest,
                oldest_due_age=(snapshot.now - oldest).total_seconds() if oldest else None,
                last_started_at=max(started) if started else None,
            )
        )
    return Overview(snapshot.now, tuple(types), tuple(paused), tuple(limits))


# -- thresholds ---------------------------------------------------------------


@dataclass(frozen=True)
class Thresholds:
    """What `check` tolerates; None leaves that aspect unchecked."""

    max_queue_age: float | None = None
    max_stuck: int | None = None
    max_dead: int | None = None

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.max_queue_age, self.max_stuck, self.max_dead))


@dataclass(frozen=True)
class Finding:
    """One threshold, the value it was held against, and whether it was breached."""

    threshold: str  # the option's name without dashes, e.g. "max-queue-age"
    value: float
    limit: float
    breached: bool
    detail: str

    @property
    def line(self) -> str:
        if self.breached:
            return f"BREACHED {self.threshold}={self._show(self.limit)}: {self.detail}"
        return f"OK {self.threshold}={self._show(self.limit)}: {self.detail}"

    def _show(self, number: float) -> str:
        if self.threshold in ("max-queue-age", "max-snapshot-age"):
            return seconds_text(number)
        return f"{number:g}"


def evaluate(overview: Overview, thresholds: Thresholds) -> list[Finding]:
    """One finding per threshold given, in the order the options are documented."""
    findings = []
    if thresholds.max_queue_age is not None:
        oldest, age = overview.oldest_due, overview.oldest_due_age or 0.0
        detail = (
            (
                f"the oldest due run ({oldest.job_type}) has waited {_age(age)}"
                if oldest
                else "nothing is waiting"
            )
            + _paused_note(overview)
            + _throttled_note(overview)
        )
        findings.append(_finding("max-queue-age", age, thresholds.max_queue_age, detail))
    if thresholds.max_stuck is not None:
        stuck = overview.expired_leases
        per_type = _per_type({t.job_type: t.expired_leases for t in overview.types})
        detail = f"{stuck} running run(s) with an expired lease{per_type}"
        findings.append(_finding("max-stuck", stuck, thresholds.max_stuck, detail))
    if thresholds.max_dead is not None:
        dead = overview.dead
        per_type = _per_type({t.job_type: t.dead for t in overview.types})
        findings.append(
            _finding("max-dead", dead, thresholds.max_dead, f"{dead} dead run(s){per_type}")
        )
    return findings


def _paused_note(overview: Overview) -> str:
    if not overview.paused:
        return ""
    pauses = "; ".join(pause_text(p, overview.now) for p in overview.paused)
    return f" (paused, not counted: {pauses})"


def _throttled_note(overview: Overview) -> str:
    if not overview.throttled:
        return ""
    return f" (throttled, not counted: {'; '.join(map(throttle_text, overview.throttled))})"


def throttle_text(limit: TypeLimit) -> str:
    """`send_email: at most 2 running, per tenant`: a limit holding runs back, in words."""
    from cronjob.limits import describe

    return f"{limit.job_type}: {describe(limit)}"


def pause_text(pause: TypePause, now: datetime) -> str:
    """`send_email by alice 12m ago: SMTP down`: which type, who paused it, when and why,
    on one line (the reason is anyone's text: printing it safely is the printer's job)."""
    from cronjob.text import one_line

    since = seconds_text(max(0.0, (now - pause.paused_at).total_seconds()))
    why = f": {one_line(pause.reason, limit=PAUSE_REASON_CHARS)}" if pause.reason else ""
    return f"{pause.job_type} by {pause.paused_by} {since} ago{why}"


def _finding(threshold: str, value: float, limit: float, detail: str) -> Finding:
    return Finding(threshold, value, limit, value > limit, detail)


def _age(seconds: float) -> str:
    text = seconds_text(seconds)
    return text if seconds < 60 else f"{text} ({seconds:.0f}s)"


def _per_type(counts: dict[str, int]) -> str:
    parts = [f"{job_type} {n}" for job_type, n in counts.items() if n]
    return f" ({', '.join(parts)})" if parts else ""


def seconds_text(seconds: float) -> str:
    """`742s` as an operator reads it at a glance: `12m22s`."""
    if seconds < 10:
        return f"{seconds:.1f}s".replace(".0s", "s")
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h{minutes:02d}m" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}m{secs:02d}s" if secs else f"{minutes}m"
    return f"{secs}s"
