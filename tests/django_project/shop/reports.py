"""A task outside the app's tasks module: a tick runs it when the settings' schedules name it."""

from django.tasks import task

from shop.models import Entry


@task()
def weekly(label):
    Entry.objects.create(label=label)
