"""Error reports to Sentry (extra `sentry`): one report per failed attempt.

A tick reports when Sentry is configured: `SENTRY_DSN` is set (the tick then initializes
the SDK from the environment, `SENTRY_ENVIRONMENT` and `SENTRY_RELEASE` included, with
none of its automatic integrations), or a handler module initialized the SDK itself.
What a handler raises is reported once, from the thread (or task) that ran it, with the
run's fields as tags and context; a `Retry` is no error and is not reported. Reports are
sent by the SDK's own thread and flushed before the tick exits, within the tick's bound.

A report holds no secret a stored error would not: the SDK the tick initializes sends no
frame's local variables (a handler's `payload` is one) and redacts every event
(`before_send`); a report of the tick's, whoever initialized the SDK, is made so by an
event processor of its own scope. An application that initializes the SDK itself passes
`include_local_variables=False, before_send=cronjob.sentry.before_send` for its own
reports to be so too.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from cronjob.handlers import Retry
from cronjob.models import Outcome
from cronjob.text import redact_value
from cronjob.tick.flight import Flight
from cronjob.tick.observers import Observer


def configured() -> bool:
    """Whether Sentry is set up or asked for; the SDK is not imported to tell."""
    if os.environ.get("SENTRY_DSN", "").strip():
        return True
    sdk = sys.modules.get("sentry_sdk")
    client = getattr(sdk, "get_client", None)  # sentry-sdk 2 and later
    return client is not None and client().is_active()


def before_send(event: dict[str, Any], hint: Any = None) -> dict[str, Any]:
    """A Sentry `before_send` (and `before_send_transaction`): the event without its frames'
    local variables, every text in it redacted as jobrunner redacts a stored error
    (cronjob.text.redact: passwords, tokens, keys...), and any field named for a secret
    (`password`, `api_key`, `Authorization`...) replaced by `***`."""
    return redact_value(_without_local_variables(event))  # type: ignore[no-any-return]


def _without_local_variables(value: Any) -> Any:
    # Frames are in each exception's stacktrace, each thread's, and the event's own.
    if isinstance(value, dict):
        frames = value.get("frames")
        if isinstance(frames, list):
            for frame in frames:
                if isinstance(frame, dict):
                    frame.pop("vars", None)
        for item in value.values():
            _without_local_variables(item)
    elif isinstance(value, list):
        for item in value:
            _without_local_variables(item)
    return value


class Reports(Observer):
    """Reports each handler's exception to Sentry, with the run it happened in."""

    def __init__(self) -> None:
        import sentry_sdk

        if not sentry_sdk.get_client().is_active():
            sentry_sdk.init(
                default_integrations=False,
                auto_enabling_integrations=False,
                include_local_variables=False,
                before_send=before_send,  # type: ignore[arg-type]
                before_send_transaction=before_send,  # type: ignore[arg-type]
            )
        self._sdk = sentry_sdk

    def returned(self, flight: Flight, outcome: Outcome, raised: BaseException | None) -> None:
        if raised is None or isinstance(raised, Retry):
            return
        run = flight.run
        fields = {
            "run_id": run.id,
            "job_type": run.job_type,
            "attempt": run.attempt,
            "final_attempt": run.final_attempt,
            "tenant_id": run.tenant_id,
            "scheduled_for": run.scheduled_for.isoformat() if run.scheduled_for else None,
        }
        with self._sdk.new_scope() as scope:
            # Whoever initialized the SDK: this report holds no more than the stored error.
            scope.add_event_processor(before_send)
            scope.set_tag("jobrunner.job_type", run.job_type)
            scope.set_tag("jobrunner.run_id", str(run.id))
            scope.set_tag("jobrunner.attempt", str(run.attempt))
            if run.tenant_id is not None:
                scope.set_tag("jobrunner.tenant_id", run.tenant_id)
            scope.set_context("jobrunner run", fields)
            scope.capture_exception(raised)

    def close(self, timeout: float) -> None:
        self._sdk.flush(timeout=timeout)
