-- OpenTelemetry: the W3C trace context of whoever enqueued the run (its traceparent and
-- tracestate headers), so that the tick's span for each attempt continues that trace. NULL
-- for runs enqueued without one (and for every run a schedule makes). Nullable columns
-- without a default: no rewrite of the table, and its lock is held for an instant.
ALTER TABLE job_runs
    ADD COLUMN traceparent text,
    ADD COLUMN tracestate text;
