"""The shop's handlers: what `jobrunner tick --handlers shop.jobs` runs in production."""

from cronjob import Fail, Retry, handler
from shop import payments


@handler("send_welcome_email")
def send_welcome_email(ctx, payload):
    ctx.db.execute("INSERT INTO outbox (address, subject) VALUES (%s, 'Welcome!')", [payload["to"]])
    ctx.db.execute("UPDATE users SET welcomed = true WHERE id = %s", [payload["user_id"]])
    ctx.log.info("welcome email queued", to=payload["to"])


@handler("charge_card", max_attempts=3, backoff=("1m", "10m"))
def charge_card(ctx, payload):
    amount = ctx.db.execute(
        "SELECT amount_cents FROM orders WHERE id = %s", [payload["order_id"]]
    ).fetchone()[0]
    if payments.charge(payload["card"], amount) == "declined":
        raise Fail("card declined")
    ctx.db.execute("UPDATE orders SET paid = true WHERE id = %s", [payload["order_id"]])
    from cronjob import enqueue

    enqueue(ctx.db, "send_receipt", {"order_id": payload["order_id"]})


@handler("send_receipt")
def send_receipt(ctx, payload):
    if ctx.once(f"receipt:{payload['order_id']}"):
        ctx.db.execute(
            "INSERT INTO outbox (address, subject) VALUES ('customer', %s)",
            [f"Receipt for order {payload['order_id']}"],
        )


@handler("send_reminder")
def send_reminder(ctx, payload):
    ctx.db.execute("INSERT INTO outbox (address, subject) VALUES ('customer', 'Reminder')")


@handler("nightly_report")
def nightly_report(ctx, payload):
    ctx.db.execute("INSERT INTO reports (day) VALUES (%s::timestamptz::date)", [ctx.scheduled_for])


@handler("rate_limited_export")
def rate_limited_export(ctx, payload):
    raise Retry("30s", reason="the export API allows one call a minute")


@handler("notify_async")
async def notify_async(ctx, payload):
    db = await ctx.db
    await db.execute(
        "INSERT INTO outbox (address, subject) VALUES (%s, 'Notified')", [payload["to"]]
    )
