"""The examples of the documentation's Getting started pages and how-to guides, run.

Each page's fenced blocks are read in order. A ```python block runs in one namespace per page
(pages build on their own earlier blocks), a ```sh / ```bash / ```shell / ```console block in
bash (`set -euo pipefail`), its `jobrunner ...` commands against the test database. Every other
language (```text, ```toml, ```ini, ```yaml, ```cron, ```sql) is not run, and neither is a block
right after `<!-- not-run: REASON -->`, which must give its reason.

What an example takes as given (an app's `conn`, its `create_order`, a file it names) is set up
per page by `SETUPS` below, never by editing the example. Two rewrites stand in for what a
test cannot do: `pip install` lines are checked to name this package and not run (it is
installed), and the app's database URL of the examples (`postgresql://app@db.internal/app`)
is the test database's.

`python -m tests.docexamples PAGE URL WORKDIR` runs one page's blocks and prints `ran
PAGE:LINE` for each; a failing block ends it with the block's page and line.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import conninfo

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PYTHON = {"python", "py"}
SHELL = {"sh", "bash", "shell", "console"}
APP_URL = re.compile(r"postgresql(\+psycopg)?://app@db\.internal/app")
NOT_RUN = re.compile(r"^\s*<!--\s*not-run:(.*?)-->\s*$")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    text: str
    not_run: str | None = None  # the marker's reason ("" when it gave none)

    @property
    def runs(self) -> bool:
        return self.not_run is None and self.lang in PYTHON | SHELL

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def example_pages() -> list[Path]:
    """The pages whose examples run: Getting started and the how-to guides."""
    return sorted((DOCS / "getting-started").glob("*.md")) + sorted((DOCS / "guides").glob("*.md"))


def blocks_of(page: Path) -> list[Block]:
    """Every fenced block of `page`, in order (an indented fence, in a list, too)."""
    name = page.relative_to(DOCS).as_posix()
    lines = page.read_text().split("\n")
    found, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        lang = opening.group(2)
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        marker = NOT_RUN.match(lines[i - 1]) if i else None
        body = textwrap.dedent("\n".join(lines[i + 1 : end])) + "\n"
        reason = marker.group(1).strip() if marker else None
        found.append(Block(name, i + 1, lang, body, reason))
        i = end + 1
    return found


def as_url(info: str, scheme: str = "postgresql") -> str:
    """The test database's connection string as a URL (a socket directory as `host=`)."""
    params = conninfo.conninfo_to_dict(info)
    query = "&".join(f"{k}={v}" for k, v in params.items() if k not in ("dbname", "user"))
    user = params.get("user", "")
    return f"{scheme}://{user}@/{params['dbname']}" + (f"?{query}" if query else "")


def shell_script(block: Block, url: str) -> str:
    """The block as bash runs it: `pip install` lines checked and left out, the app's URL
    the test database's."""
    out = []
    for line in block.text.replace("\\\n", " ").split("\n"):
        if re.match(r"\s*pip install ", line):
            assert "pg-jobrunner" in line, f"{block}: installs something else: {line}"
            assert "/path/to/jobrunner" in line, f"{block}: no from-a-checkout form: {line}"
            continue
        out.append(APP_URL.sub(lambda m: as_url(url, "postgresql"), line))
    return "set -euo pipefail\n" + "\n".join(out)


# -- what each page's examples take as given ------------------------------------------------


@dataclass
class Page:
    """A page's run: its namespace, the test database, a directory to work in, the threads
    its setup started (joined at the end) and the checks made once its blocks have run."""

    url: str
    workdir: Path
    conn: psycopg.Connection[Any]
    ns: dict[str, Any] = field(default_factory=dict)
    threads: list[threading.Thread] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)
    checks: list[Callable[[Page], None]] = field(default_factory=list)

    def sql(self, statement: str, *params: Any) -> None:
        with psycopg.connect(self.url, autocommit=True) as c:
            c.execute(statement, params or None)

    def table(self, name: str, columns: str) -> None:
        """An app's table of the page's own, dropped when the page is done: the session's
        database is every test's."""
        self.sql(f"CREATE TABLE {name} ({columns})")
        self.tables.append(name)

    def write(self, name: str, text: str) -> None:
        (self.workdir / name).write_text(textwrap.dedent(text).lstrip())

    def runs(self, job_type: str) -> int:
        with psycopg.connect(self.url, autocommit=True) as c:
            return c.execute(
                "SELECT count(*) FROM job_runs WHERE job_type = %s", (job_type,)
            ).fetchone()[0]


def jobrunner_command() -> list[str]:
    script = Path(sys.executable).with_name("jobrunner")
    return [str(script)] if script.exists() else [sys.executable, "-m", "cronjob"]


def _orders_table(page: Page) -> None:
    page.table("docs_orders", "id bigserial PRIMARY KEY, item text")


def _incident_runs(page: Page) -> None:
    """The runs the commands name: 1234 and 1235 dead, 1236 queued."""
    for run_id, status in ((1234, "dead"), (1235, "dead"), (1236, "queued")):
        finished = "now()" if status == "dead" else "NULL"
        page.sql(
            "INSERT INTO job_runs (id, job_type, payload, status, attempts, finished_at,"
            " last_error, error_type) VALUES (%s, 'send_email', '{}', %s, 5,"
            f" {finished}, 'SMTPServerDisconnected: gone', 'SMTPServerDisconnected')",
            run_id,
            status,
        )


def setup_your_app(page: Page) -> None:
    _orders_table(page)

    def create_order(conn: Any, *_: Any) -> int:
        return conn.execute(
            "INSERT INTO docs_orders (item) VALUES ('book') RETURNING id"
        ).fetchone()[0]

    page.ns.update(
        create_order=create_order,
        user_ids=[1, 2, 3],
        load_user=lambda user_id: None,
        mail_server_busy=lambda: False,
        send=lambda *_: None,
        build_report=lambda *_: None,
    )
    page.write("job.json", '{"path": "/srv/import/orders.csv"}\n')
    page.write("runs.jsonl", '{"type": "send_digest", "payload": {"user_id": 1}}\n')
    # `wait` returns when a tick's finalize commits: once the run is there, a tick runs it.
    page.write(
        "docs_thumbnails.py",
        """
        from cronjob import handler


        @handler("render_thumbnail")
        def render_thumbnail(ctx, payload):
            ctx.log.info("rendered", image=payload["image"])
        """,
    )
    tick = [*jobrunner_command(), "tick", "--handlers", "docs_thumbnails"]
    tick += ["--handlers-path", str(page.workdir), "--types", "render_thumbnail"]

    def tick_once_enqueued() -> None:
        until = time.monotonic() + 120  # bounds a hung test only
        while not page.runs("render_thumbnail") and time.monotonic() < until:
            time.sleep(0.02)
        log = (page.workdir / "tick.log").open("wb")
        subprocess.run(tick, cwd=page.workdir, stdout=subprocess.DEVNULL, stderr=log, check=False)

    page.threads.append(threading.Thread(target=tick_once_enqueued, daemon=True))
    page.threads[-1].start()

    def handler_registered(page: Page) -> None:
        from cronjob.handlers import registry

        assert "send_weekly_report" in registry(), "the handler of the page was not registered"
        assert page.runs("send_receipt") == 1 and page.runs("send_digest") == 4

    page.checks.append(handler_registered)


def setup_async(page: Page) -> None:
    from pydantic import BaseModel

    _orders_table(page)

    class Order(BaseModel):
        item: str

    async def insert_order(conn: Any, order: Order) -> int:
        cursor = await conn.execute(
            "INSERT INTO docs_orders (item) VALUES (%s) RETURNING id", (order.item,)
        )
        return (await cursor.fetchone())[0]

    page.ns.update(
        Order=Order,
        insert_order=insert_order,
        DATABASE_URL=page.url,
        WAREHOUSE_URL="http://warehouse.invalid/orders",
    )

    def an_order_posted_enqueues_its_job(page: Page) -> None:
        from fastapi.testclient import TestClient

        response = TestClient(page.ns["app"]).post("/orders", json={"item": "book"})
        assert response.status_code == 200, response.text
        assert page.runs("notify_warehouse") == 1

    page.checks.append(an_order_posted_enqueues_its_job)


def setup_batches(page: Page) -> None:
    page.ns.update(send_weekly_report=lambda *_, **__: None, tenants=["acme", "globex"])
    page.sql(
        "INSERT INTO job_runs (id, job_type, payload) VALUES (1234, 'invoices.render_pdf', '{}')"
    )
    page.sql(
        "INSERT INTO job_runs (id, job_type, payload) VALUES (1235, 'invoices.render_pdf', '{}')"
    )
    # The page's two batches (enqueue_batch, then `--jsonl --then`) are 16 and 17, as
    # `batch show 17` names the second.
    page.sql("SELECT setval(pg_get_serial_sequence('job_batches', 'id'), 15)")
    page.write(
        "reports.jsonl",
        '{"type": "reports.weekly", "payload": {"week": "2026-01-05"}, "tenant": "acme"}\n',
    )
    page.write(
        "emails.jsonl",
        '{"type": "invoices.email", "payload": {"invoice": 7}, "after": [1234, 1235]}\n',
    )


def setup_dashboard(page: Page) -> None:
    from fastapi import FastAPI

    page.ns["app"] = FastAPI()

    def the_mounted_dashboard_answers(page: Page) -> None:
        from fastapi.testclient import TestClient

        with TestClient(page.ns["app"]) as client:
            response = client.get("/ops/jobs/healthz")
        assert response.status_code == 200, response.text
        assert response.json()["ok"] is True

    page.checks.append(the_mounted_dashboard_answers)


def setup_flow_control(page: Page) -> None:
    from cronjob import enqueue

    page.ns.update(enqueue=enqueue)


def setup_sentry(page: Page) -> None:
    os.environ["SENTRY_DSN"] = "https://public@sentry.invalid/1"


def setup_sqlalchemy(page: Page) -> None:
    from sqlalchemy import BigInteger, Column
    from sqlalchemy.orm import DeclarativeBase

    page.table("docs_sa_orders", "id bigserial PRIMARY KEY")

    class Base(DeclarativeBase):
        pass

    # Without annotations: this module's are strings, which the mapper would look up here.
    class Order(Base):
        __tablename__ = "docs_sa_orders"
        id = Column(BigInteger, primary_key=True)

    page.ns["order"] = Order()
    page.checks.append(lambda page: _one_run(page, "send_receipt"))


def _one_run(page: Page, job_type: str) -> None:
    assert page.runs(job_type) == 1, f"expected one {job_type} run"


SETUPS: dict[str, Callable[[Page], None]] = {
    "getting-started/failures.md": _incident_runs,
    "getting-started/your-app.md": setup_your_app,
    "guides/async.md": setup_async,
    "guides/batches.md": setup_batches,
    "guides/bulk-loads.md": lambda page: None,
    "guides/dashboard.md": setup_dashboard,
    "guides/flow-control.md": setup_flow_control,
    "guides/incidents.md": _incident_runs,
    "guides/sentry.md": setup_sentry,
    "guides/sqlalchemy.md": setup_sqlalchemy,
}


# -- running a page -------------------------------------------------------------------------


def run_python(block: Block, page: Page) -> None:
    text = APP_URL.sub(lambda m: as_url(page.url, m.group(0).split("://")[0]), block.text)
    exec(compile(text, str(block), "exec"), page.ns)


def run_shell(block: Block, page: Page) -> None:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(jobrunner_command()[0]).parent), env["PATH"]])
    done = subprocess.run(
        ["bash", "-c", shell_script(block, page.url)],
        cwd=page.workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        output = f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        raise AssertionError(f"{block}: exit {done.returncode}\n{output}")


def run_page(name: str, url: str, workdir: Path) -> Iterator[Block]:
    """Run the examples of docs/NAME in order; yields each block once it has run."""
    blocks = [b for b in blocks_of(DOCS / name) if b.runs]
    # What the examples start (a tick, a dashboard) finds the database as an app's would.
    os.environ["JOBRUNNER_DATABASE_URL"] = url
    with psycopg.connect(url) as conn:
        page = Page(url, workdir, conn, {"conn": conn, "__name__": "docs_example"})
        try:
            SETUPS.get(name, lambda page: None)(page)
            for block in blocks:
                (run_python if block.lang in PYTHON else run_shell)(block, page)
                yield block
            for check in page.checks:
                check(page)
        finally:
            for thread in page.threads:
                thread.join(timeout=120)
            conn.close()  # a transaction an example left open would hold the drop back
            for table in page.tables:
                page.sql(f"DROP TABLE IF EXISTS {table}")


def main(argv: list[str]) -> int:
    name, url, workdir = argv
    try:
        for block in run_page(name, url, Path(workdir)):
            print(f"ran {block}", flush=True)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
