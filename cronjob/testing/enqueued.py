"""What is enqueued in a test: the waiting runs, matched by what a test says of them, and the
message of an assertion that does not hold, which lists what was enqueued instead.

A run is waiting while it is `queued` or `failed` (a retry is due later). A test matches
runs by job type and by any of these, all of which must hold:

- `payload`: a subset of the run's payload: every key given has that value, nested dicts
  matched the same way; any other value (a list, a number) must be equal;
- `tenant`: the run's tenant (as enqueued: an integer matches its text);
- `run_at`: when the run is due: a timezone-aware datetime, or a duration from the test's
  clock (`"5m"`, seconds, a timedelta);
- any other field of `cronjob.models.Run` by name (`priority`, `idempotency_key`,
  `max_attempts`, `attempts`, `status`, ...), which must be equal.
"""

from __future__ import annotations

import json
from dataclasses import fields
from datetime import datetime, timedelta
from typing import Any

from cronjob.models import Run

WAITING = ("queued", "failed")
RUN_FIELDS = frozenset(f.name for f in fields(Run))
SHOWN = 20  # runs listed in a failed assertion's message, at most
SHOWN_PAYLOAD = 300  # characters of each one's payload


def waiting_runs(conn: Any, job_type: str | None = None) -> list[Run]:
    """The waiting runs, oldest first; of `job_type` only, if given."""
    from cronjob import store

    runs = store.runs_list(
        conn,
        statuses=WAITING,
        job_types=[job_type] if job_type else None,
        limit=1_000_000,
        streamed=False,
    )
    return sorted(runs, key=lambda run: run.id)


def matcher(now: datetime, match: dict[str, Any]) -> dict[str, Any]:
    """What a test said of runs (the module's keys), as the values to compare fields with;
    TypeError naming a key that is none of them."""
    wanted: dict[str, Any] = {}
    for key, value in match.items():
        if key == "tenant":
            wanted["tenant_id"] = None if value is None else str(value)
        elif key == "run_at":
            wanted["run_at"] = _moment(now, value)
        elif key == "status" and value is not None:
            wanted["status"] = str(getattr(value, "value", value))
        elif key in RUN_FIELDS:
            wanted[key] = value
        else:
            known = ", ".join(sorted({"tenant", *RUN_FIELDS} - {"tenant_id"}))
            raise TypeError(f"cannot match runs by {key!r}: match by one of {known}")
    return wanted


def matches(run: Run, wanted: dict[str, Any]) -> bool:
    for key, value in wanted.items():
        if key == "payload":
            if not contains(run.payload, value):
                return False
        elif key == "status":
            if run.status.value != value:
                return False
        elif getattr(run, key) != value:
            return False
    return True


def contains(actual: Any, expected: Any) -> bool:
    """`expected` is a subset of `actual`: dicts key by key, nested; anything else equal."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            key in actual and contains(actual[key], value) for key, value in expected.items()
        )
    return bool(actual == expected)


def described(job_type: str | None, wanted: dict[str, Any]) -> str:
    """What was asked for, in words: 'a waiting run of job type 'x' with payload ⊇ {...}'."""
    what = f"of job type {job_type!r}" if job_type else "of any job type"
    parts = []
    for key, value in wanted.items():
        if key == "payload":
            parts.append(f"payload containing {_json(value)}")
        elif key == "tenant_id":
            parts.append(f"tenant {value!r}")
        else:
            parts.append(f"{key} {value!r}")
    return what + (f" with {', '.join(parts)}" if parts else "")


def listing(runs: list[Run], heading: str) -> str:
    """`heading`, and the runs a line each (at most SHOWN of them)."""
    if not runs:
        return f"{heading}: none"
    lines = [f"{heading} ({len(runs)}):"]
    lines.extend(f"  {line(run)}" for run in runs[:SHOWN])
    if len(runs) > SHOWN:
        lines.append(f"  … and {len(runs) - SHOWN} more")
    return "\n".join(lines)


def line(run: Run) -> str:
    payload = _json(run.payload)
    if len(payload) > SHOWN_PAYLOAD:
        payload = payload[:SHOWN_PAYLOAD] + "…"
    tenant = f" tenant={run.tenant_id!r}" if run.tenant_id is not None else ""
    status = f" {run.status.value}, attempt {run.attempts}" if run.attempts else ""
    return (
        f"#{run.id} {run.job_type}{tenant} payload={payload}"
        f" run_at={run.run_at.isoformat()}{status}"
    )


def _moment(now: datetime, value: Any) -> datetime:
    if isinstance(value, datetime):
        if value.utcoffset() is None:
            raise TypeError("run_at must be a timezone-aware datetime, or a duration from now")
        return value
    if isinstance(value, timedelta):
        return now + value
    from cronjob.inputs import parse_duration

    return now + timedelta(seconds=parse_duration(value, what="run_at"))


def _json(value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=False, default=repr)
    except (TypeError, ValueError):
        return repr(value)
