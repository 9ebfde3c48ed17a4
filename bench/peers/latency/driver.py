"""bench/latency.py's enqueuer: runs one scenario with one system's client, in that system's
Python, and writes "<k> <commit time> <due time>" a line (Unix times; the due time only for
delayed jobs) to the output file once it is done.

    python driver.py <client module> <scenario as JSON> <output file>

A scenario is {"kind": "rate", "start_k": K, "count": N, "rate": R, "connections": C,
"delay": D}: N jobs, one every 1/R seconds, over C connections taking turns, each job due D
seconds after it is enqueued (0: at once); or {"kind": "burst", "start_k": K, "count": N}:
N jobs in one transaction. The commit time is taken when the enqueue call returns.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any


async def _rate(client_module: Any, scenario: dict[str, Any]) -> list[str]:
    count, rate = scenario["count"], scenario["rate"]
    connections, delay = scenario.get("connections", 1), scenario.get("delay", 0)
    start_k = scenario["start_k"]
    clients = [await client_module.connect() for _ in range(connections)]
    lines: list[str] = []
    begin = time.monotonic() + 0.2

    async def turn(i: int) -> None:
        client = clients[i]
        for n in range(i, count, connections):
            pause = begin + n / rate - time.monotonic()
            if pause > 0:
                await asyncio.sleep(pause)
            due = datetime.now(UTC) + timedelta(seconds=delay) if delay else None
            await client_module.enqueue(client, start_k + n, due)
            committed = time.time()
            lines.append(f"{start_k + n} {committed:.6f} {due.timestamp() if due else ''}")

    try:
        await asyncio.gather(*(turn(i) for i in range(connections)))
    finally:
        for client in clients:
            await client_module.close(client)
    return lines


async def _burst(client_module: Any, scenario: dict[str, Any]) -> list[str]:
    ks = list(range(scenario["start_k"], scenario["start_k"] + scenario["count"]))
    client = await client_module.connect()
    try:
        await client_module.enqueue_batch(client, ks)
        committed = time.time()
    finally:
        await client_module.close(client)
    return [f"{k} {committed:.6f} " for k in ks]


def main() -> None:
    module_name, scenario_json, output = sys.argv[1:4]
    client_module = importlib.import_module(module_name)
    scenario = json.loads(scenario_json)
    run = _burst if scenario["kind"] == "burst" else _rate
    lines = asyncio.run(run(client_module, scenario))
    with open(output, "w") as out:
        out.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
