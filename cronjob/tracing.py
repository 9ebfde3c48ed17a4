"""OpenTelemetry tracing of a tick (extra `otel`), configured by the standard `OTEL_*`
environment variables.

A tick traces when `OTEL_TRACES_EXPORTER` names an exporter (`otlp`, `console`) or an
OTLP endpoint is set (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`),
and not when `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`. `configured` asks
the environment only; OpenTelemetry is imported once a tick that found work builds its
`Tracing` observer, so an idle tick, or one that does not trace, imports none of it.
A tracer provider the application set up (in a handler module) is used as it is;
otherwise the tick makes its own and sets it as the global one, so handlers' own spans
go with the tick's: a batch span processor and the OTLP/HTTP exporter (or the
console's), the other `OTEL_*` settings (endpoint, headers, timeouts, resource, service
name: `jobrunner` unless given) read by OpenTelemetry itself.

The spans:
- `jobrunner tick`, one per tick that found work, from its first statement to its close;
- one per statement of the tick's (`jobrunner materialize`, `jobrunner claim`,
  `jobrunner finalize`, ...), children of the tick span, made on the thread that runs
  the statement (the claim's own, the writer's) with the tick span's context given
  explicitly, as context does not cross threads by itself;
- one per attempt, `process <job type>` (kind CONSUMER, the messaging conventions'
  process span), current while the handler runs (`ctx.span`, or OpenTelemetry's
  current-span API), ended with the time the handler returned once the outcome is
  written. A run enqueued with a trace context (cronjob.tracecontext) is a child of the
  enqueuer's span, in the enqueuer's trace, with a link to the tick span; any other run
  is a child of the tick span. A child, not a link: one run is one message, processed
  by one attempt at a time (the conventions' case for a parent), and the trace of the
  request that enqueued it is where whoever follows it looks. A run that waits hours,
  or is retried, shows as such: its attempts are siblings under that span, each its
  own span, however late.

An exception is recorded on its span as an `exception` event whose attributes
(`exception_attributes`) are redacted as a stored error is: the SDK's own
`record_exception` would carry the raw message and traceback (a URL's password, a
payload's values quoted in a message), which a stored error never holds. The status
message of a failed span is the stored error's message.

Exported before the tick exits, signals and grace period included: the tick closes its
observers on its way out (`Steps.running`), and this one ends what is left, ends the
tick span and flushes the provider, waiting at most the tick's bound (5 s; half a
second after a second signal).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from cronjob.handlers import Retry
from cronjob.models import ClaimedRun, Errored, Outcome
from cronjob.tick.flight import Flight
from cronjob.tick.observers import Observer, attempt_key

T = TypeVar("T")

SYSTEM = "jobrunner"  # messaging.system
ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
# An outcome that is an error for the span's status.
FAILED_OUTCOMES = frozenset({"failed", "dead", "lost", "unrecorded"})


def configured(env: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment asks for traces; OpenTelemetry is not imported."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return bool(exporter) or any(env.get(name, "").strip() for name in ENDPOINTS)


class Tracing(Observer):
    """Spans of the tick, its statements and each attempt (see the module's docstring)."""

    def __init__(self, *, worker: str) -> None:
        from opentelemetry import context, propagate, trace

        from cronjob.log import capture_library_logs

        capture_library_logs(("opentelemetry",))  # its warnings as JSON lines, as ours
        self._provider, self._owned = _tracer_provider()
        self._tracer = self._provider.get_tracer("jobrunner", _version())
        self._context, self._trace = context, trace
        self._extract = propagate.get_global_textmap().extract
        self._worker = worker
        self._tick = self._tracer.start_span(
            "jobrunner tick",
            kind=trace.SpanKind.INTERNAL,
            attributes={"messaging.system": SYSTEM, "messaging.client.id": worker},
        )
        self._in_tick = trace.set_span_in_context(self._tick)
        self._to_tick = [trace.Link(self._tick.get_span_context())]
        # Each attempt's span, its context token while the handler runs, and when the
        # handler returned: [span, token, end time], by attempt_key.
        self._attempts: dict[Any, list[Any]] = {}

    def started(self, flight: Flight) -> None:
        run = flight.run
        parent, links = self._in_tick, None
        if run.traceparent is not None:
            carrier = {"traceparent": run.traceparent}
            if run.tracestate:
                carrier["tracestate"] = run.tracestate
            parent, links = self._extract(carrier), self._to_tick
        span = self._tracer.start_span(
            f"process {run.job_type}",
            context=parent,
            kind=self._trace.SpanKind.CONSUMER,
            links=links,
            attributes=self._attributes(run),
        )
        flight.ctx.span = span
        token = self._context.attach(self._trace.set_span_in_context(span))
        self._attempts[attempt_key(run)] = [span, token, None]

    def returned(self, flight: Flight, outcome: Outcome, raised: BaseException | None) -> None:
        entry = self._attempts.get(attempt_key(flight.run))
        if entry is None:
            return
        span, token, _ = entry
        entry[1], entry[2] = None, time.time_ns()
        if token is not None:
            self._context.detach(token)
        if raised is not None and not isinstance(raised, Retry):
            if isinstance(outcome, Errored):  # the same text, redacted, as is stored
                span.add_event("exception", _attributes_of(outcome))
            else:
                span.add_event("exception", exception_attributes(raised))

    def finished(self, run: ClaimedRun, outcome: str, error: Errored | None) -> None:
        entry = self._attempts.pop(attempt_key(run), None)
        if entry is not None:
            self._end(entry[0], outcome, error, entry[2])

    def statement(self, what: str, op: Callable[[Any], T]) -> Callable[[Any], T]:
        tracer, parent = self._tracer, self._in_tick
        attributes = {"db.system.name": "postgresql", "db.operation.name": what}
        kind, status = self._trace.SpanKind.CLIENT, self._trace.Status
        failed = self._trace.StatusCode.ERROR

        def traced(conn: Any) -> T:
            # Not the SDK's own recording of an exception: its message is the raw one.
            with tracer.start_as_current_span(
                f"jobrunner {what}",
                context=parent,
                kind=kind,
                attributes=attributes,
                record_exception=False,
                set_status_on_exception=False,
            ) as span:
                try:
                    result = op(conn)
                except BaseException as exc:
                    recorded = exception_attributes(exc)
                    span.add_event("exception", recorded)
                    span.set_status(status(failed, recorded["exception.message"]))
                    raise
                _count(span, result)
                return result

        return traced

    def close(self, timeout: float) -> None:
        for span, _token, ended in self._attempts.values():
            # Its outcome was never written: the database failed, or the tick was stopped
            # before it could be (a handler past its grace period).
            self._end(span, "unrecorded", None, ended)
        self._attempts.clear()
        self._tick.end()
        flush = getattr(self._provider, "force_flush", None)  # the API's own provider has none
        if flush is not None:
            flush(int(timeout * 1000))
        if self._owned:
            self._provider.shutdown()

    def _attributes(self, run: ClaimedRun) -> dict[str, Any]:
        # Each attribute costs every span its encoding: the job type and run id are the
        # conventions' destination and message id, not repeated; the worker is the tick
        # span's.
        attributes = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.destination.name": run.job_type,
            "messaging.message.id": str(run.id),
            "jobrunner.attempt": run.attempt,
        }
        if run.tenant_id is not None:
            attributes["jobrunner.tenant_id"] = run.tenant_id
        return attributes

    def _end(self, span: Any, outcome: str, error: Errored | None, ended: int | None) -> None:
        from opentelemetry.trace import Status, StatusCode

        span.set_attribute("jobrunner.outcome", outcome)
        if error is not None:
            span.set_attribute("error.type", error.error_type)
        if outcome in FAILED_OUTCOMES:
            span.set_status(Status(StatusCode.ERROR, error.message if error else outcome))
        span.end(end_time=ended)


def exception_attributes(exc: BaseException) -> dict[str, str]:
    """The attributes of an `exception` span event (OpenTelemetry's semantic conventions:
    `exception.type`, `exception.message`, `exception.stacktrace`), redacted as jobrunner
    redacts a stored error (cronjob.text.redact), the traceback trimmed as it is.

    For spans of an application's own: `span.add_event("exception",
    exception_attributes(exc))` in place of `span.record_exception(exc)`.
    """
    from cronjob.tick.execute import errored

    return _attributes_of(errored(exc))


def _attributes_of(error: Errored) -> dict[str, str]:
    return {
        "exception.type": error.error_type,
        "exception.message": error.message,
        "exception.stacktrace": error.traceback or "",
    }


def _count(span: Any, result: Any) -> None:
    """How many rows a statement of the tick's wrote or claimed, on its span."""
    if isinstance(result, tuple) and len(result) == 2:  # finalize-and-claim
        finalized, claimed = result
        span.set_attribute("jobrunner.finalized", len(finalized))
        span.set_attribute("jobrunner.claimed", len(claimed))
    elif isinstance(result, set | list):
        span.set_attribute("jobrunner.rows", len(result))


def _tracer_provider() -> tuple[Any, bool]:
    """The application's tracer provider, if it set one up; else one of the tick's own
    (True: the tick shuts it down)."""
    from opentelemetry import trace

    current = trace.get_tracer_provider()
    if not isinstance(current, trace.ProxyTracerProvider):
        return current, False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "jobrunner"}))
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(_exporter()))
    # The global one: handlers' own spans, and those of the libraries they call, go
    # where the tick's go, under the attempt's span.
    trace.set_tracer_provider(provider)
    return provider, True


def _exporter() -> Any:
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() or "otlp"
    if exporter == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if exporter != "otlp":
        from cronjob.log import get_logger

        get_logger().warning(
            "OTEL_TRACES_EXPORTER names an exporter jobrunner does not make; using otlp",
            exporter=exporter[:100],
        )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pg-jobrunner")
    except PackageNotFoundError:
        return "unknown"
