"""Where things live: statements, the code that runs them, and the shapes they return.

Nothing here needs a database: these read the source and the modules themselves.
"""

from __future__ import annotations

import uuid

from cronjob import queries
from cronjob.models import ClaimedRun


def _claim_columns() -> list[str]:
    """The names the claim's columns come back under, in order."""
    return [
        column.split(" AS ")[-1].strip() for column in queries.RUNS_CLAIM_MANY_COLUMNS.split(",")
    ]


def test_the_claim_returns_claimed_run_fields_in_their_order_all_but_the_lease_token():
    assert _claim_columns() == [name for name in ClaimedRun._fields if name != "lease_token"]


def test_a_claimed_run_takes_each_column_of_the_claim_into_the_field_of_its_name():
    from cronjob import store

    values: dict[str, object] = {name: f"<{name}>" for name in _claim_columns()}
    values["payload"] = '{"from": "payload"}'  # the claim sends it as JSON text
    token = uuid.uuid4()

    [run] = store._claimed_runs([tuple(values.values())], token)

    assert run.payload == {"from": "payload"}
    assert run.lease_token == token
    for name in _claim_columns():
        if name != "payload":
            assert getattr(run, name) == values[name], name
