"""No models: jobrunner's tables are its own migrations' (sql/), applied after Django's.

The module exists so that Django sends this app `post_migrate` (see apps.py).
"""
