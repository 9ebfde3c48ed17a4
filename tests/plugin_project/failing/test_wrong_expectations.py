"""Assertions that do not hold, to show what their failures say (run on their own)."""

from shop.accounts import place_order, sign_up


def test_expecting_another_address(jobrunner):
    sign_up(jobrunner.conn, "ada@example.com")
    place_order(jobrunner.conn, user_id=7, amount_cents=1250)

    jobrunner.assert_enqueued("send_welcome_email", payload={"to": "bob@example.com"})


def test_expecting_no_charge(jobrunner):
    place_order(jobrunner.conn, user_id=7, amount_cents=1250)

    jobrunner.refute_enqueued("charge_card", tenant=7)
