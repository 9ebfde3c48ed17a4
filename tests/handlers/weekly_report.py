"""The weekly-report example of docs/explanation/exactly-once.md, verbatim between the two
marker lines.

tests/test_effects.py checks that the page shows exactly this code, and runs it.
"""

from __future__ import annotations

# docs example begins
import json
import os
import urllib.request

from cronjob import enqueue, handler


@handler("weekly_report.build", max_attempts=10, lease="5m")
def build_weekly_report(ctx, payload):
    user_id, week_start = payload["user_id"], payload["week_start"]
    # Once per (user_id, week_start), however often this runs or is enqueued: the key,
    # the report, the follow-up job and "succeeded" commit together or not at all.
    if not ctx.once(f"weekly_report:{user_id}:{week_start}"):
        return
    (total,) = ctx.db.execute(
        "SELECT coalesce(sum(amount_cents), 0)::bigint FROM orders"
        " WHERE user_id = %s AND placed_at >= %s::date AND placed_at < %s::date + 7",
        (user_id, week_start, week_start),
    ).fetchone()
    ctx.db.execute(
        "INSERT INTO weekly_reports (user_id, week_start, total_cents) VALUES (%s, %s, %s)",
        (user_id, week_start, total),
    )
    enqueue(ctx.db, "weekly_report.notify", {**payload, "total_cents": total})


@handler("weekly_report.notify", max_attempts=5)
def notify_weekly_report(ctx, payload):
    # Outside the database: the key is committed before the call, so a crash or an
    # error after it means no notice rather than two.
    if not ctx.at_most_once(f"weekly_report_notice:{payload['user_id']}:{payload['week_start']}"):
        return
    request = urllib.request.Request(
        os.environ["REPORT_WEBHOOK_URL"],
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=10).close()


# docs example ends
