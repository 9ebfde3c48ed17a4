"""The no-op handler jobrunner runs in the benchmark (`--handlers bench.noop_handlers`)."""

from cronjob import handler


@handler("noop")
def noop(ctx, payload):
    pass
