"""The card gateway the shop calls: a stand-in whose answers a test sets, as an app's tests
stub the services it pays for."""

answers = []  # what the next calls answer, in turn: "ok", "timeout" or "declined"
calls = []


def charge(card, amount_cents):
    calls.append((card, amount_cents))
    answer = answers.pop(0) if answers else "ok"
    if answer == "timeout":
        raise TimeoutError("the gateway did not answer")
    return answer
