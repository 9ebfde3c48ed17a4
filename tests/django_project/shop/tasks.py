"""The test project's tasks: one for each thing the Django tests show."""

import time
from pathlib import Path

from django.tasks import task

from cronjob import handler
from cronjob.django import atomic
from cronjob.django import task as jobrunner_task
from shop.models import Entry, Order


@task()
def add(a, b):
    return a + b


@task()
async def add_async(a, b):
    return a + b


@jobrunner_task(max_attempts=2, backoff="1s")
def explode(message):
    raise ValueError(message)


@task()
def record(label):
    Entry.objects.create(label=label)


@task(takes_context=True)
def attempt_number(context):
    return context.attempt


@task(takes_context=True)
async def attempt_number_async(context):
    return context.attempt


@task(takes_context=True)
def own_result_id(context):
    return context.task_result.id


@task(takes_context=True)
async def own_result_id_async(context):
    return context.task_result.id


@task()
def huge():
    return "x" * 2_000_000


@jobrunner_task(atomic=True, max_attempts=3)
def place_order(ref, fail=False):
    Order.objects.create(ref=ref)
    if fail:
        raise RuntimeError("payment declined")
    return ref


@jobrunner_task(atomic=True, takes_context=True, lease="5s")
def place_order_slowly(context, ref, marker):
    Order.objects.create(ref=ref)
    if context.attempt == 1:
        Path(marker).write_text("written, not committed")
        time.sleep(600)  # killed here by the test
    return ref


@task()
def tally(label):
    Entry.objects.create(label=label)


@handler("shop.import_order")
@atomic
def import_order(ctx, payload):
    Order.objects.create(ref=payload["ref"])
    if ctx.once(f"import:{payload['ref']}") and payload.get("fail"):
        raise RuntimeError("import failed")


@task()
def lose_connection():
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")


@task()
def lose_connection_quietly():
    """Ends this thread's connection from another one: Django sees no error."""
    import psycopg
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    from cronjob.django.connection import database_conninfo

    with psycopg.connect(database_conninfo(), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])


@jobrunner_task(atomic=True)
def place_order_with_a_failing_hook(ref):
    from django.db import transaction

    Order.objects.create(ref=ref)
    transaction.on_commit(lambda: 1 / 0)


@task(queue_name="reports")
def weekly_report(week):
    return f"report {week}"


@task()
def unstorable():
    from datetime import date

    return {"on": date(2026, 1, 5)}  # JSON holds no date


@jobrunner_task(max_attempts=1)
def give_up(message):
    raise ValueError(message)


@jobrunner_task(max_attempts=1, timeout="1s")
def too_slow():
    time.sleep(3)


@jobrunner_task()
def total(*numbers):
    return sum(numbers)
