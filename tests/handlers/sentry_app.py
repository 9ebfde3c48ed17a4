"""An application that initializes Sentry itself, as the SDK's documentation shows (local
variables included), then declares its handlers (those of tests/handlers/observed.py)."""

from __future__ import annotations

import os

import sentry_sdk

import tests.handlers.observed  # noqa: F401 - registers the handlers

sentry_sdk.init(dsn=os.environ["SHOP_SENTRY_DSN"], default_integrations=False)
