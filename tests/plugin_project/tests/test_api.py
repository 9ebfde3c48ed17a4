"""The HTTP API, with its connection dependency pointed at the test's transaction."""

import pytest
from fastapi.testclient import TestClient
from shop.api import app, get_conn

from cronjob.testing import Drained


@pytest.fixture
def client(jobrunner):
    app.dependency_overrides[get_conn] = lambda: jobrunner.conn
    yield TestClient(app)
    app.dependency_overrides.clear()


def test_signing_up_over_http_sends_a_welcome_email(client, jobrunner):
    response = client.post("/signup", params={"email": "ada@example.com"})
    assert response.status_code == 200

    jobrunner.assert_enqueued("send_welcome_email", payload={"to": "ada@example.com"})
    assert jobrunner.drain() == Drained(succeeded=1)
