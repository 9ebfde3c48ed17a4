"""The no-op handler jobrunner runs in the benchmark (`--handlers bench.noop_handlers`)."""

from cronjob import handler


@handler("noop")
def noop(ctx, payload):
    pass


# A batch's callback of a type of its own: bench/batches.py's "next tick" case drains the
# members with a tick that has no handler for it (`--types noop`).
@handler("noop.summary")
def noop_summary(ctx, payload):
    pass
