"""A small shop on psycopg: sign-ups and orders, and the jobs they enqueue.

The sample project of jobrunner's pytest plugin (tests/test_testing_plugin.py runs its
tests as a user would run them).
"""
