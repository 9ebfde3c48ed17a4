"""A FastAPI app instrumented with OpenTelemetry's own FastAPI instrumentation, which
enqueues a job from a request: run as a process of its own by tests/test_tracing.py.

    python -m tests.otel_web_app DATABASE_URL

Serves one POST /orders through Starlette's test client (the request goes through the
ASGI app in this process) and prints the enqueued run's id and the request's trace id.
"""

from __future__ import annotations

import sys

import psycopg
from fastapi import FastAPI
from fastapi.testclient import TestClient
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from cronjob import enqueue

DATABASE_URL = sys.argv[1]
app = FastAPI()


@app.post("/orders")
def create_order() -> dict[str, object]:
    with psycopg.connect(DATABASE_URL) as conn:  # commits on leaving
        run_id = enqueue(conn, "test.traced", {"order": 7})
    span = trace.get_current_span().get_span_context()
    return {
        "run_id": run_id,
        "trace_id": f"{span.trace_id:032x}",
        "span_id": f"{span.span_id:016x}",
    }


def main() -> None:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    FastAPIInstrumentor.instrument_app(app, tracer_provider=provider)
    with TestClient(app) as client:
        answer = client.post("/orders")
    answer.raise_for_status()
    provider.shutdown()  # exports what is left
    print(answer.text)


if __name__ == "__main__":
    main()
