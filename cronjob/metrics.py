"""Prometheus text exposition of the queue, for scraping or node_exporter's textfile collector.

A cron-driven runner has no process to scrape, so the numbers come from the
table itself: whoever runs `jobrunner metrics` (or a tick with
`--metrics-textfile`) sees the same queue every host sees.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cronjob.health import Overview, TypeHealth, read_overview
from cronjob.models import DefinitionSchedule, DurationSummary, SnapshotHolder, Status
from cronjob.settings import LISTENING_TICK_STALE

if TYPE_CHECKING:
    from cronjob.staleness import Staleness
    from cronjob.store.listen import ListeningTick

DURATION_WINDOW = 3600.0  # the run-time summary covers runs finished in the last hour
QUANTILES = (0.5, 0.9, 0.99)


def collect(conn: Any, *, now: datetime | None = None) -> str:
    """Read the queue, its pauses, durations and schedules, and what holds back cleanup,
    and render them."""
    from cronjob import horizon, store

    overview = read_overview(conn, now=now)
    durations = store.runs_summarize_durations(
        conn, window=DURATION_WINDOW, quantiles=QUANTILES, now=now
    )
    schedules = store.definitions_list_schedules(conn)
    from cronjob.staleness import assess

    verdicts = [assess(row) for row in store.definitions_list_health(conn)]
    holders = horizon.read_holders(conn, now=now)
    ticks = store.ticks_list(conn, stale=LISTENING_TICK_STALE, now=now)
    return render(overview, durations, schedules, verdicts, holders, ticks)


def render(
    overview: Overview,
    durations: Sequence[DurationSummary],
    schedules: Sequence[DefinitionSchedule] = (),
    verdicts: Sequence[Staleness] = (),
    holders: Sequence[SnapshotHolder] = (),
    ticks: Sequence[ListeningTick] = (),
) -> str:
    lines: list[str] = []
    for name, kind, help_text, samples in (
        *_run_families(overview.types),
        _paused_family(overview),
        _throttled_family(overview),
        _duration_family(durations),
        *_schedule_families(schedules, verdicts),
        *_snapshot_families(holders),
        _ticks_family(ticks),
    ):
        lines.append(f"# HELP {name} {_escape_help(help_text)}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(samples)
    return "\n".join(lines) + "\n"


# name, type, help text, sample lines
Family = tuple[str, str, str, Iterable[str]]


def _run_families(types: Sequence[TypeHealth]) -> list[Family]:
    """The gauges read from the table, one sample per job type (and status)."""
    return [
        # Every status of every type known to the table is written, zeros included,
        # so a series does not vanish (and silence an alert) when its count drops to 0.
        (
            "jobrunner_runs",
            "gauge",
            "Runs in the job_runs table, by status and job type.",
            (
                _sample(
                    "jobrunner_runs",
                    {"job_type": t.job_type, "status": s.value},
                    t.by_status[s.value],
                )
                for t in types
                for s in Status
            ),
        ),
        (
            "jobrunner_due_runs",
            "gauge",
            "Queued or failed runs whose run_at has come: waiting for a tick to claim them.",
            (_sample("jobrunner_due_runs", {"job_type": t.job_type}, t.due) for t in types),
        ),
        (
            "jobrunner_oldest_due_age_seconds",
            "gauge",
            "How long the oldest due run of each job type has waited to be claimed (0: none due).",
            (
                _sample(
                    "jobrunner_oldest_due_age_seconds",
                    {"job_type": t.job_type},
                    t.oldest_due_age or 0.0,
                )
                for t in types
            ),
        ),
        (
            "jobrunner_expired_leases",
            "gauge",
            "Running runs whose lease expired: their worker crashed, was killed or stalled, "
            "and no tick has rescued them yet.",
            (
                _sample("jobrunner_expired_leases", {"job_type": t.job_type}, t.expired_leases)
                for t in types
            ),
        ),
        (
            "jobrunner_dead_runs",
            "gauge",
            "Runs that gave up (out of attempts or failed permanently) and are not yet pruned.",
            (_sample("jobrunner_dead_runs", {"job_type": t.job_type}, t.dead) for t in types),
        ),
        (
            "jobrunner_last_started_timestamp_seconds",
            "gauge",
            "When a run of each job type was last claimed (Unix time).",
            (
                _sample(
                    "jobrunner_last_started_timestamp_seconds",
                    {"job_type": t.job_type},
                    t.last_started_at.timestamp(),
                )
                for t in types
                if t.last_started_at is not None
            ),
        ),
    ]


def _paused_family(overview: Overview) -> Family:
    return (
        "jobrunner_job_type_paused",
        "gauge",
        "1 for each job type paused with `jobrunner pause`: no tick claims its runs.",
        (
            _sample("jobrunner_job_type_paused", {"job_type": t}, 1)
            for t in sorted(overview.paused_types)
        ),
    )


def _throttled_family(overview: Overview) -> Family:
    due = {t.job_type: t.due for t in overview.types}
    return (
        "jobrunner_throttled_runs",
        "gauge",
        "Due runs of each job type whose limit (`jobrunner limit`) holds them back now.",
        (
            _sample("jobrunner_throttled_runs", {"job_type": t}, due.get(t, 0))
            for t in sorted(overview.throttled_types)
        ),
    )


def _schedule_families(
    schedules: Sequence[DefinitionSchedule], verdicts: Sequence[Staleness]
) -> list[Family]:
    """Per schedule, read from its definition and health rows: no history is scanned."""
    return [
        (
            "jobrunner_schedule_last_success_timestamp_seconds",
            "gauge",
            "When a run of each schedule last succeeded (Unix time; 0: never).",
            (
                _sample(
                    "jobrunner_schedule_last_success_timestamp_seconds",
                    {"schedule": v.name},
                    v.last_success_at.timestamp() if v.last_success_at else 0,
                )
                for v in verdicts
            ),
        ),
        (
            "jobrunner_schedule_stale",
            "gauge",
            "1 when an enabled schedule's due occurrences have not succeeded within its window "
            "(as `jobrunner check --stale-schedules`), else 0.",
            (
                _sample(
                    "jobrunner_schedule_stale", {"schedule": v.name}, int(v.stale and v.enabled)
                )
                for v in verdicts
            ),
        ),
        (
            "jobrunner_schedule_overlap_skips_total",
            "counter",
            "Occurrences of each schedule its overlap policy (skip or queue) did not run because "
            "an earlier run had not finished; `jobrunner schedule show` lists the recent ones.",
            (
                _sample(
                    "jobrunner_schedule_overlap_skips_total", {"schedule": d.name}, d.overlap_skips
                )
                for d in schedules
            ),
        ),
    ]


def _ticks_family(ticks: Sequence[ListeningTick]) -> Family:
    """Ticks that stay (`tick --listen`), listening and polling: both always written."""
    polling = sum(t.listening_since is None for t in ticks)
    return (
        "jobrunner_ticks_listening",
        "gauge",
        "Ticks that stay (tick --listen) now, by how they learn of new runs: asleep on LISTEN, "
        "or polling where LISTEN cannot work (behind a pooler in transaction mode).",
        (
            _sample("jobrunner_ticks_listening", {"mode": "listening"}, len(ticks) - polling),
            _sample("jobrunner_ticks_listening", {"mode": "polling"}, polling),
        ),
    )


def _snapshot_families(holders: Sequence[SnapshotHolder]) -> list[Family]:
    """What holds back cleanup of the queue's tables (cronjob.horizon): always written,
    0 when nothing does, so an alert on them never goes silent for want of a series."""
    from cronjob.horizon import oldest, xmin_age

    found = oldest(holders)
    named = found if found is not None else (holders[0] if holders else None)
    labels = (
        {
            "kind": named.kind.value,
            "pid": "" if named.pid is None else str(named.pid),
            "name": named.name or "",
            "application_name": named.application_name or "",
            "user": named.user or "",
            "state": named.state or "",
        }
        if named is not None
        else None
    )
    return [
        (
            "jobrunner_oldest_snapshot_age_seconds",
            "gauge",
            "How long the oldest transaction holding back cleanup (VACUUM) of the queue's "
            "tables has been open (0: none, or none whose age this role can see).",
            [
                _sample(
                    "jobrunner_oldest_snapshot_age_seconds",
                    {},
                    found.age or 0.0 if found is not None else 0.0,
                )
            ],
        ),
        (
            "jobrunner_oldest_snapshot_xmin_age",
            "gauge",
            "How many transactions the cleanup horizon of the queue's tables is behind the "
            "newest (0: nothing holds it back).",
            [_sample("jobrunner_oldest_snapshot_xmin_age", {}, xmin_age(holders))],
        ),
        (
            "jobrunner_oldest_snapshot_info",
            "gauge",
            "1 for the oldest transaction or replication slot holding back cleanup: what it "
            "is (`jobrunner status` shows its query).",
            [_sample("jobrunner_oldest_snapshot_info", labels, 1)] if labels else [],
        ),
    ]


def _duration_family(durations: Sequence[DurationSummary]) -> Family:
    """Run time by job type over the recent window, as a summary with its quantiles."""
    duration_samples = []
    for d in durations:
        for quantile, seconds in d.quantiles:
            duration_samples.append(
                _sample(
                    "jobrunner_run_duration_seconds",
                    {"job_type": d.job_type, "quantile": f"{quantile:g}"},
                    seconds,
                )
            )
        duration_samples.append(
            _sample("jobrunner_run_duration_seconds_sum", {"job_type": d.job_type}, d.total)
        )
        duration_samples.append(
            _sample("jobrunner_run_duration_seconds_count", {"job_type": d.job_type}, d.count)
        )
    return (
        "jobrunner_run_duration_seconds",
        "summary",
        f"Run time (claim to finish) of runs that succeeded or died in the last "
        f"{DURATION_WINDOW / 60:g} minutes; _sum and _count cover the same window, "
        "they are not cumulative counters.",
        duration_samples,
    )


def write_textfile(path: Path, text: str) -> None:
    """Replace `path` atomically: node_exporter never reads a half-written file.

    The temporary file lives in the same directory (a rename is only atomic
    within one filesystem) and does not end in `.prom`, so the textfile
    collector ignores it.
    """
    directory = path.parent
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        # mkstemp creates the file private; give it the mode any new file of this
        # process gets, so the umask decides who reads it (the collector usually
        # runs as another user: 0644 under the common umask 022).
        os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def _umask() -> int:
    # Read, not set: os.umask can only be read by changing it, for every thread.
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _sample(name: str, labels: dict[str, str], value: float) -> str:
    if not labels:
        return f"{name} {_number(value)}"
    rendered = ",".join(f'{key}="{_escape_label(text)}"' for key, text in labels.items())
    return f"{name}{{{rendered}}} {_number(value)}"


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


def _escape_label(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")
