"""The dashboard's batches over real HTTP: the list with its progress bars, a batch's page
with its members by status, and a run's page linking its batch and its dependencies."""

from __future__ import annotations

import pytest

from cronjob import enqueue, enqueue_batch, enqueue_many, new_run
from tests.web_server import request, serving

pytest.importorskip("starlette")


def dashboard(db_url: str):
    from cronjob.web import app

    return app(db_url)


def test_batches_show_progress_members_by_status_and_the_links_of_a_run(db_url, conn):
    with conn.transaction():
        batch = enqueue_batch(
            conn, [new_run("mail"), new_run("mail"), new_run("mail")], then=new_run("summary")
        )
    first, second, _ = batch.run_ids
    conn.execute(
        "UPDATE job_runs SET status = 'succeeded', finished_at = now() WHERE id = %s", [first]
    )
    conn.execute("UPDATE job_runs SET status = 'dead', finished_at = now() WHERE id = %s", [second])
    child = enqueue(conn, "mail", {}, after=[batch.run_ids[2]])
    with serving(dashboard(db_url)) as base:
        listed = request(f"{base}/batches")
        page = request(f"{base}/batches/{batch.id}")
        member = request(f"{base}/runs/{batch.run_ids[2]}")
        waiting = request(f"{base}/runs/{child}")
        members = request(f"{base}/runs?batch={batch.id}&status=dead")
        missing = request(f"{base}/batches/424242")
    assert listed.status == 200
    assert '<progress class="progress" max="3" value="2">2/3</progress>' in listed.body
    assert f'href="/batches/{batch.id}"' in listed.body
    assert page.status == 200 and "2 of 3 members finished" in page.body
    assert f"/runs?batch={batch.id}&amp;status=dead" in page.body
    assert f'member of <a href="/batches/{batch.id}">batch {batch.id}</a>' in member.body
    assert f'<a href="/runs/{child}">{child}</a> (waiting)' in member.body
    assert f'<a href="/runs/{batch.run_ids[2]}">{batch.run_ids[2]}</a> (queued)' in waiting.body
    assert members.status == 200 and f'href="/runs/{second}"' in members.body
    assert f'href="/runs/{first}"' not in members.body
    assert missing.status == 404


def test_a_run_page_links_the_batch_it_calls_back_and_counts_the_runs_it_does_not_list(
    db_url, conn
):
    from cronjob.store.dependencies import LISTED_AT_MOST as SHOWN

    with conn.transaction():
        batch = enqueue_batch(conn, [new_run("mail")], then=new_run("summary"))
    conn.execute(
        "UPDATE job_runs SET status = 'succeeded', finished_at = now() WHERE id = %s",
        [batch.run_ids[0]],
    )
    [callback] = conn.execute("SELECT callback_run_id FROM job_batches").fetchone()
    children = enqueue_many(conn, [new_run("mail", after=[callback]) for _ in range(50)])
    with serving(dashboard(db_url)) as base:
        page = request(f"{base}/runs/{callback}")
    assert page.status == 200
    assert f'callback of <a href="/batches/{batch.id}">batch {batch.id}</a>' in page.body
    assert f'<a href="/runs/{children[SHOWN - 1]}">' in page.body
    assert f'<a href="/runs/{children[SHOWN]}">' not in page.body
    assert f"(waiting) and {50 - SHOWN} more</dd>" in page.body
