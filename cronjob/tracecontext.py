"""W3C trace context at enqueue: the `traceparent` and `tracestate` a run is stored with.

A leaf, imported by every door that enqueues: it imports nothing of OpenTelemetry. The
active context is read only when the application has imported OpenTelemetry itself (an
app that traces has, long before it enqueues); otherwise there is no context to read and
nothing is paid. The command line reads the carrier OpenTelemetry defines for processes,
the `TRACEPARENT` and `TRACESTATE` environment variables.
"""

from __future__ import annotations

import os
import re
import sys

# version-trace id-parent id-flags, lower-case hex (W3C Trace Context, level 1). Version
# ff is invalid, and so are all-zero ids.
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
MAX_TRACESTATE = 512  # what the specification asks every propagator to carry at least


def valid_traceparent(value: str) -> bool:
    match = _TRACEPARENT.fullmatch(value)
    return bool(
        match
        and match.group(1) != "ff"
        and match.group(2) != "0" * 32
        and match.group(3) != "0" * 16
    )


def current() -> dict[str, str]:
    """The active OpenTelemetry context as run options ({} when there is none)."""
    if "opentelemetry.trace" not in sys.modules:
        return {}
    from opentelemetry.trace import get_current_span

    context = get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    ids = f"{context.trace_id:032x}-{context.span_id:016x}"
    found = {"traceparent": f"00-{ids}-{context.trace_flags:02x}"}
    state = context.trace_state.to_header() if context.trace_state else ""
    if state and len(state) <= MAX_TRACESTATE:
        found["tracestate"] = state
    return found


def from_environment() -> dict[str, str]:
    """`TRACEPARENT` and `TRACESTATE` as run options; an invalid traceparent is ignored (as a
    propagator ignores it: the run then starts a trace of its own), and so is its state."""
    parent = os.environ.get("TRACEPARENT", "").strip().lower()
    if not valid_traceparent(parent):
        return {}
    found = {"traceparent": parent}
    state = os.environ.get("TRACESTATE", "").strip()
    if state and len(state) <= MAX_TRACESTATE and state.isascii() and state.isprintable():
        found["tracestate"] = state
    return found
