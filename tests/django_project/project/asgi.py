"""The test project served over ASGI with jobrunner's dashboard mounted at /jobs/, as the
dashboard guide (docs/guides/dashboard.md) shows."""

import os

from django.core.asgi import get_asgi_application

from cronjob.web import app as jobrunner_dashboard

django_app = get_asgi_application()
dashboard = jobrunner_dashboard(basic_auth=os.environ["JOBRUNNER_WEB_AUTH"])


async def application(scope, receive, send):
    if scope["type"] == "http" and (scope["path"] + "/").startswith("/jobs/"):
        await dashboard({**scope, "root_path": scope.get("root_path", "") + "/jobs"}, receive, send)
    else:
        await django_app(scope, receive, send)
