"""Handlers of bench/observe.py (`--handlers bench.observe_handlers`): no-ops, and handlers
that log one line each, with their run logs kept and without."""

from cronjob import handler


@handler("noop")
def noop(ctx, payload):
    pass


# At warning, so the line is written (and kept) at the benchmark's log level.
@handler("log_one")
def log_one(ctx, payload):
    ctx.log.warning("did the work", items=3)


@handler("log_one_uncaptured", capture_logs=False)
def log_one_uncaptured(ctx, payload):
    ctx.log.warning("did the work", items=3)
