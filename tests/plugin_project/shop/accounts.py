"""What the shop's web views call: each writes in the caller's transaction and enqueues its
jobs in that same transaction, so a job exists only if the rest of it does."""

from cronjob import enqueue


def sign_up(conn, email):
    with conn.transaction():
        user_id = conn.execute(
            "INSERT INTO users (email) VALUES (%s) RETURNING id", [email]
        ).fetchone()[0]
        enqueue(conn, "send_welcome_email", {"user_id": user_id, "to": email})
    return user_id


def place_order(conn, user_id, amount_cents, *, card="4242"):
    with conn.transaction():
        order_id = conn.execute(
            "INSERT INTO orders (user_id, amount_cents) VALUES (%s, %s) RETURNING id",
            [user_id, amount_cents],
        ).fetchone()[0]
        enqueue(
            conn,
            "charge_card",
            {"order_id": order_id, "card": card},
            idempotency_key=f"charge:{order_id}",
            tenant_id=user_id,
        )
    return order_id


def remind_later(conn, user_id):
    return enqueue(conn, "send_reminder", {"user_id": user_id}, delay="1d")
