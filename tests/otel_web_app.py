"""A web app that traces its requests and enqueues a job from one, as an app instrumented
with OpenTelemetry does: run as a process of its own by tests/test_tracing.py.

    python -m tests.otel_web_app DATABASE_URL

Serves one POST /orders through Starlette's test client (the request goes through the
ASGI app in this process) and prints the enqueued run's id and the request's trace id.
"""

from __future__ import annotations

import sys

import psycopg
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.propagate import extract
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from cronjob import enqueue

DATABASE_URL = sys.argv[1]
tracer = trace.get_tracer("shop.web")


async def create_order(request: Request) -> JSONResponse:
    with psycopg.connect(DATABASE_URL) as conn:  # commits on leaving
        run_id = enqueue(conn, "test.traced", {"order": 7})
    span = trace.get_current_span().get_span_context()
    return JSONResponse({"run_id": run_id, "trace_id": f"{span.trace_id:032x}",
                         "span_id": f"{span.span_id:016x}"})  # fmt: skip


class Traced:
    """A server span around each request, continuing the caller's trace: what
    OpenTelemetry's ASGI instrumentation does, in a few lines."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        name = f"{scope['method']} {scope['path']}"
        with tracer.start_as_current_span(
            name, context=extract(headers), kind=trace.SpanKind.SERVER
        ):
            await self.app(scope, receive, send)


def main() -> None:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    app = Traced(Starlette(routes=[Route("/orders", create_order, methods=["POST"])]))
    with TestClient(app) as client:
        answer = client.post("/orders")
    answer.raise_for_status()
    provider.shutdown()  # exports what is left
    print(answer.text)


if __name__ == "__main__":
    main()
