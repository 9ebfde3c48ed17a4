"""A real OTLP/HTTP trace endpoint for the tests: a small HTTP server on the loopback that
decodes each export request with the OpenTelemetry protocol's own classes and keeps the
spans it carried."""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Span:
    """One exported span, as the endpoint decoded it."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: str
    attributes: dict[str, Any]
    links: list[tuple[str, str]]
    status: str
    status_message: str
    events: list[str]
    event_attributes: list[dict[str, Any]]  # each event's, in the order of `events`
    service: str
    start_ns: int
    end_ns: int


@dataclass
class Collector:
    """What the endpoint received; `url` is its base (OTEL_EXPORTER_OTLP_ENDPOINT)."""

    url: str
    spans: list[Span] = field(default_factory=list)
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def named(self, name: str) -> list[Span]:
        with self.lock:
            return [span for span in self.spans if span.name == name]

    def wait_for(self, found: Callable[[Collector], Any], timeout: float = 20.0) -> Any:
        until = time.monotonic() + timeout
        while not (value := found(self)):
            if time.monotonic() > until:
                names = sorted({span.name for span in self.spans})
                raise AssertionError(f"the endpoint never received what was awaited: {names}")
            time.sleep(0.05)
        return value

    def environment(self) -> dict[str, str]:
        """What a process needs to export its traces here."""
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.url,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        }


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def _decode(body: bytes) -> list[Span]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
    from opentelemetry.proto.trace.v1.trace_pb2 import Status

    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    Span(
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        kind=ProtoSpan.SpanKind.Name(span.kind),
                        attributes={a.key: _value(a.value) for a in span.attributes},
                        links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                        status=Status.StatusCode.Name(span.status.code),
                        status_message=span.status.message,
                        events=[event.name for event in span.events],
                        event_attributes=[
                            {a.key: _value(a.value) for a in event.attributes}
                            for event in span.events
                        ],
                        service=str(resource.get("service.name", "")),
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                    )
                )
    return spans


@contextmanager
def otlp_endpoint() -> Iterator[Collector]:
    """An OTLP/HTTP endpoint on 127.0.0.1, receiving until the block ends."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceResponse,
    )

    collector: Collector

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            encoding = self.headers.get("Content-Encoding", "")
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            spans = _decode(body)
            with collector.lock:
                collector.spans.extend(spans)
                collector.requests += 1
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    collector = Collector(url=f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield collector
    finally:
        server.shutdown()
        server.server_close()
