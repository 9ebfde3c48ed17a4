"""Handlers of the async section (`--handlers bench.async_handlers`).

Plain and async variants of the same work side by side, so that every drain of the
section loads the same module and only the handler kind differs.
"""

import asyncio
import time

from cronjob import handler


@handler("noop")
def noop(ctx, payload):
    pass


@handler("async_noop")
async def async_noop(ctx, payload):
    pass


@handler("sleep_0_1")
def sleep_0_1(ctx, payload):
    time.sleep(0.1)


@handler("async_sleep_0_1")
async def async_sleep_0_1(ctx, payload):
    await asyncio.sleep(0.1)


@handler("async_sleep_1")
async def async_sleep_1(ctx, payload):
    await asyncio.sleep(1)
