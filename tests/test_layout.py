"""Where things live: statements, the code that runs them, the shapes they return, and the
names the prose cites.

Nothing here needs a database: these read the source and the modules themselves.
"""

from __future__ import annotations

import ast
import functools
import importlib
import io
import pkgutil
import re
import tokenize
import uuid
from pathlib import Path
from types import ModuleType

from cronjob import queries
from cronjob.models import ClaimedRun
from cronjob.queries.runs import RUNS_CLAIM_MANY_COLUMNS


def _claim_columns() -> list[str]:
    """The names the claim's columns come back under, in order."""
    columns = re.split(r",(?![^()]*\))", RUNS_CLAIM_MANY_COLUMNS)  # not inside (...)
    return [column.split(" AS ")[-1].strip() for column in columns]


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


# -- where SQL lives --

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "cronjob"
QUERIES = PACKAGE / "queries"
STORE = PACKAGE / "store"

# The start of a statement, as opposed to SQL named in prose: keywords in capitals (as
# jobrunner writes SQL, and as prose does not) in the order a statement puts them, or
# calls only SQL makes.
SQL_STATEMENT = re.compile(
    r"""
      \bSELECT\b .{0,400}? \bFROM\b
    | \bSELECT \s+ (?: \w+ \s* \( | \d | \* | DISTINCT\b | EXISTS\b )
    | \bINSERT \s+ INTO \s+ \w+
    | \bUPDATE \s+ \w+ (?: \s+ \w+ )? \s+ SET \s+ \w+
    | \bDELETE \s+ FROM \s+ \w+
    | \b(?: CREATE | ALTER | DROP ) \s+ (?: (?: UNIQUE \s+ )? INDEX | TABLE | VIEW | SEQUENCE
                                        | TRIGGER | FUNCTION | SCHEMA | DATABASE | ROLE | TYPE )\b
    | \bTRUNCATE \s+ (?: TABLE \s+ )? \w+
    | \bSET \s+ (?: LOCAL | SESSION ) \s+ \w+
    | \b(?: SAVEPOINT | RELEASE \s+ SAVEPOINT | ROLLBACK \s+ TO \s+ SAVEPOINT ) \s+ \w+
    | \bWITH \s+ \w+ \s+ AS \s+ (?: (?: NOT \s+ )? MATERIALIZED \s+ )? \(
    | (?i: \b(?: pg_advisory_\w+ | pg_try_advisory_\w+ | set_config | current_setting
                | pg_notify ) \s* \( )
    | \A \s* (?: UN )? LISTEN \s+ ["\w]+ \s* \Z
    """,
    re.VERBOSE | re.DOTALL,
)
# psycopg's ways of sending SQL: a connection's or cursor's execute, executemany, copy.
SQL_CALLS = frozenset({"execute", "executemany", "copy"})


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the nodes that are docstrings: prose, whatever words they use."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _imported_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def sql_found(source: str) -> list[str]:
    """Each string holding a SQL statement, and each call that could send one, in `source`."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    # `copy.copy(x)` is a module's function, not a connection's method.
    modules = _imported_names(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and SQL_STATEMENT.search(node.value)
        ):
            found.append((node.lineno, f"SQL text {node.value.strip()[:60]!r}"))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in SQL_CALLS
            and not (isinstance(node.func.value, ast.Name) and node.func.value.id in modules)
        ):
            found.append((node.lineno, f".{node.func.attr}(...)"))
    return [f"line {line}: {what}" for line, what in sorted(found)]


def test_no_module_but_queries_and_the_store_holds_or_executes_sql():
    outside = [
        path
        for path in sorted(PACKAGE.rglob("*.py"))
        if QUERIES not in path.parents and STORE not in path.parents
    ]
    assert PACKAGE / "cli.py" in outside  # the walk reaches the package, subpackages too
    assert PACKAGE / "commands" / "demo.py" in outside
    found = {
        str(path.relative_to(ROOT)): problems
        for path in outside
        if (problems := sql_found(path.read_text()))
    }
    assert found == {}


def test_the_sql_check_sees_every_statement_in_queries():
    statements = _statements()
    assert len(statements) > 40
    assert [name for name, sql in statements.items() if not SQL_STATEMENT.search(sql)] == []


def test_the_sql_check_finds_statements_and_execute_calls_but_not_prose():
    source = '''
"""Deleting runs: one `DELETE ... WHERE finished_at < ...` would hold its locks for long."""
import copy

def step(conn, rows):
    """Select the runs to show from what the user asked for."""
    walker = copy.copy(rows)
    message = "select a schedule from the list, or update the file and set it again"
    conn.execute("SELECT id FROM job_runs WHERE id = %s", (1,))
    with conn.cursor().copy(QUERY):
        pass
    conn.executemany(f"UPDATE job_runs SET status = {walker}", rows)
    sql = "INSERT INTO job_runs (job_type) VALUES ('x')"
    lock = "SELECT pg_advisory_xact_lock(1)"
'''
    assert [problem.split(":")[0] for problem in sql_found(source)] == [
        "line 9",
        "line 9",
        "line 10",
        "line 12",
        "line 12",
        "line 13",
        "line 14",
    ]


# -- one name per statement, and one module of each for a table --


def _query_modules() -> dict[str, ModuleType]:
    """cronjob.queries' modules by name; the package itself holds only shared fragments."""
    return {
        info.name: importlib.import_module(f"cronjob.queries.{info.name}")
        for info in pkgutil.iter_modules(queries.__path__)
    }


def _statements() -> dict[str, str]:
    """Every statement by name; column lists are parts of statements, not statements."""
    return {
        name: value
        for module in _query_modules().values()
        for name, value in vars(module).items()
        if name.isupper()
        and not name.startswith("_")
        and not name.endswith("_COLUMNS")
        and isinstance(value, str)
    }


def _statement_homes() -> dict[str, str]:
    """Each statement's name, and the queries module it is written in."""
    statements = _statements()
    return {
        name: module_name
        for module_name, module in _query_modules().items()
        for name in vars(module).keys() & statements.keys()
    }


def _store_modules() -> list[Path]:
    """The store's modules but the facade, which runs nothing of its own."""
    return [path for path in sorted(STORE.glob("*.py")) if path.stem != "__init__"]


def _store_functions() -> dict[str, tuple[str, set[str]]]:
    """Each public store function: the module it lives in, and the statements it names
    (as `queries.<NAME>`), itself or through the private functions of its module it calls (one
    that builds a statement for two callers)."""
    functions = {}
    for path in _store_modules():
        defined = [
            node
            for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        ]
        private = {node.name: _queries_named(node) for node in defined if node.name[0] == "_"}
        for node in defined:
            if not node.name.startswith("_"):
                called = {
                    call.func.id
                    for call in ast.walk(node)
                    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                }
                through = [private[name] for name in called & private.keys()]
                functions[node.name] = (path.stem, _queries_named(node).union(*through))
    return functions


def _queries_named(node: ast.AST) -> set[str]:
    return {
        used.attr
        for used in ast.walk(node)
        if isinstance(used, ast.Attribute)
        and isinstance(used.value, ast.Name)
        and used.value.id == "queries"
    }


def test_every_statement_is_written_in_one_queries_module():
    statements = _statements()
    written = [name for module in _query_modules().values() for name in vars(module)]
    assert sorted(name for name in written if name in statements) == sorted(statements)


def test_each_store_module_runs_the_statements_of_the_queries_module_of_its_name():
    runs = {}
    for path in _store_modules():
        statements = getattr(importlib.import_module(f"cronjob.store.{path.stem}"), "queries", None)
        if statements is not None:
            runs[path.stem] = statements
    assert runs == _query_modules()


def test_every_statement_is_run_by_the_store_function_that_bears_its_name_in_its_module():
    functions = _store_functions()
    unnamed, unused, elsewhere = [], [], []
    for name, home in _statement_homes().items():
        owners = [
            f
            for f in functions
            if not f.endswith("_async") and (name == f.upper() or name.startswith(f.upper() + "_"))
        ]
        if not owners:
            unnamed.append(name)
            continue
        owner = max(owners, key=len)
        module, named = functions[owner]
        if name not in named:
            unused.append(f"{name} (not run by {owner})")
        if module != home:
            elsewhere.append(f"{name} (in queries.{home}, run by store.{module}.{owner})")
    assert unnamed == []
    assert unused == []
    assert elsewhere == []


def test_every_store_function_is_reached_through_cronjob_store():
    from cronjob import store

    missing = [
        f"store.{module}.{name}"
        for name, (module, _) in _store_functions().items()
        if getattr(store, name, None)
        is not getattr(importlib.import_module(f"cronjob.store.{module}"), name)
    ]
    assert missing == []


def test_each_async_twin_sits_beside_its_function():
    apart = []
    for path in _store_modules():
        names = [
            node.name
            for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        ]
        for before, name in zip(["", *names], names, strict=False):
            if name.endswith("_async") and before != name.removesuffix("_async"):
                apart.append(f"store.{path.stem}.{name}")
    assert apart == []


# -- the names prose cites --

# A statement's name as prose cites it, or a family of them (`RUNS_MATERIALIZE_*`).
CITED_NAME = re.compile(r"(?<![\w.])([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)(_\*)?")
# A name in the statements' or the store's modules (`queries.runs.RUNS_CLAIM_MANY`,
# `store._claimed_runs`), and one of their files (`cronjob/store/runs.py`).
CITED_ATTRIBUTE = re.compile(r"(?<![\w.])(?:cronjob\.)?((?:queries|store)(?:\.\w+)+)")
CITED_FILE = re.compile(r"(?<![\w./])(?:cronjob/)?((?:queries|store)(?:/\w+)*\.py)\b")


def _prose(tree: ast.AST, source: str) -> list[tuple[int, str]]:
    """Each docstring and comment of `source`, with the line it starts on."""
    found = [
        (node.body[0].lineno, node.body[0].value.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
        and isinstance(node.body[0].value.value, str)
    ]
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    found += [(t.start[0], t.string) for t in tokens if t.type == tokenize.COMMENT]
    return sorted(found)


@functools.cache
def _statement_names() -> tuple[set[str], set[str]]:
    """Every name a statement (or a column list) has, and the entities they start with,
    singular and plural: RUN and RUNS, DEFINITION and DEFINITIONS, ..."""
    names = {
        name
        for module in _query_modules().values()
        for name, value in vars(module).items()
        if name.isupper() and not name.startswith("_") and isinstance(value, str)
    }
    entities = {name.split("_")[0] for name in names}
    return names, entities | {e + "S" for e in entities} | {e.removesuffix("S") for e in entities}


def _roots(tree: ast.AST, head: str) -> list[str]:
    """What `head` (queries, store) names in a file: cronjob's package, or the module the
    file imports under that name (`from cronjob.queries import runs as queries`)."""
    roots = [f"cronjob.{head}"]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("cronjob"):
            roots += [f"{node.module}.{a.name}" for a in node.names if (a.asname or a.name) == head]
    return roots


def _resolves(root: str, parts: list[str]) -> bool:
    """Whether `root.parts...` names an attribute or a module that exists."""
    target: object = importlib.import_module("cronjob")
    for part in [*root.split(".")[1:], *parts]:
        if hasattr(target, part):
            target = getattr(target, part)
        elif isinstance(target, ModuleType) and hasattr(target, "__path__"):
            try:
                target = importlib.import_module(f"{target.__name__}.{part}")
            except ModuleNotFoundError:
                return False
        else:
            return False
    return True


def _a_statement(match: re.Match[str], tree: ast.AST) -> bool:
    """False for a name that reads as a statement's (it starts with an entity) but is none."""
    names, entities = _statement_names()
    name, family = match.groups()
    if name.split("_")[0] not in entities:
        return True  # not a statement's name: DATABASE_URL, MAX_BATCH
    if family:
        return any(n.startswith(name + "_") for n in names)
    return name in names


def _an_attribute(match: re.Match[str], tree: ast.AST) -> bool:
    head, *parts = match.group(1).split(".")
    return parts[-1] == "py" or any(_resolves(root, parts) for root in _roots(tree, head))


def _a_file(match: re.Match[str], tree: ast.AST) -> bool:
    return (PACKAGE / match.group(1)).exists()


CITATIONS = ((CITED_NAME, _a_statement), (CITED_ATTRIBUTE, _an_attribute), (CITED_FILE, _a_file))


def citations_broken(source: str) -> list[str]:
    """Each statement, module, name or file the docstrings and comments of `source` cite
    that does not exist."""
    tree = ast.parse(source)
    broken = [
        (start + text.count("\n", 0, match.start()), match.group())
        for start, text in _prose(tree, source)
        for pattern, exists in CITATIONS
        for match in pattern.finditer(text)
        if not exists(match, tree)
    ]
    return [f"line {line}: {cited}" for line, cited in sorted(broken)]


def test_the_citation_check_finds_what_no_longer_exists_but_not_what_does():
    source = '''
"""Claims with RUNS_CLAIM_MANY (queries.runs.RUNS_CLAIM_MANY), not RUN_CLAIM_MANY."""
import os

# RUNS_MATERIALIZE_* and RUN_MATERIALIZE_*; queries._FINAL_ATTEMPT, queries.RUN_GET,
# queries.py, store/records.py, cronjob/store/runs.py; store.runs_claim_many(conn, ...),
# store.runs_claim; MAX_BATCH and DATABASE_URL name no statement.
def step():
    """See cronjob.store.preflight, cronjob.queries.tally.CLOCK_NOW and CLOCK_NOW_MANY."""
'''
    assert citations_broken(source) == [
        "line 2: RUN_CLAIM_MANY",
        "line 5: RUN_MATERIALIZE_*",
        "line 5: queries.RUN_GET",
        "line 6: queries.py",
        "line 6: store/records.py",
        "line 7: store.runs_claim",
        "line 9: CLOCK_NOW_MANY",
    ]


def test_docstrings_and_comments_cite_only_statements_and_modules_that_exist():
    # Not the benchmark's peers, installed under bench/.envs (git-ignored): their code is theirs.
    paths = [
        path
        for folder in ("cronjob", "tests", "bench")
        for path in (ROOT / folder).rglob("*.py")
        if ".envs" not in path.relative_to(ROOT).parts
    ]
    assert ROOT / "cronjob" / "transitions.py" in paths
    broken = {
        str(path.relative_to(ROOT)): found
        for path in sorted(paths)
        if (found := citations_broken(path.read_text()))
    }
    assert broken == {}


# -- the map of the tick --

TICK = PACKAGE / "tick"
# A name in backticks that reads as code: `Pool.collect`, `execute()`, `tick/writer.py`.
CITED_CODE = re.compile(r"`((?:cronjob/)?tick/\w+\.py|[A-Za-z_][\w.]*)(?:\(\))?`")
# What the prose calls a handler's context.
ALIASES = {"ctx": "cronjob.context.JobContext"}


def _instance_attributes(cls: type) -> set[str]:
    """The attributes a class's methods set on `self`: `Workers.pending`, `Pool.flights`."""
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    }


def _attribute_path(target: object, parts: list[str]) -> bool:
    for i, part in enumerate(parts):
        if hasattr(target, part):
            target = getattr(target, part)
        elif isinstance(target, type) and part in _instance_attributes(target):
            return i == len(parts) - 1  # an instance's attribute: nothing to follow past it
        elif isinstance(target, ModuleType) and hasattr(target, "__path__"):
            try:
                target = importlib.import_module(f"{target.__name__}.{part}")
            except ModuleNotFoundError:
                return False
        else:
            return False
    return True


def _tick_name_exists(cited: str) -> bool:
    """Whether a name the tick's map cites is real: a file, a module of the tick or of
    cronjob, a name one of the tick's modules defines or imports, and what follows it."""
    if cited.endswith(".py"):
        return (PACKAGE / cited.removeprefix("cronjob/")).exists()
    head, *rest = cited.removeprefix("cronjob.").split(".")
    if head in ALIASES:
        module, _, name = ALIASES[head].rpartition(".")
        return _attribute_path(getattr(importlib.import_module(module), name), rest)
    if head == "__init__":
        return not rest
    tick_modules = [importlib.import_module(f"cronjob.tick.{m}") for m in _tick_modules()]
    homes: list[object] = [importlib.import_module("cronjob")]
    homes += [importlib.import_module("cronjob.tick"), *tick_modules]
    return any(
        _attribute_path(home, [head, *rest])
        for home in homes
        if hasattr(home, head) or (isinstance(home, ModuleType) and hasattr(home, "__path__"))
    )


def _tick_modules() -> list[str]:
    return sorted(path.stem for path in TICK.glob("*.py") if path.stem != "__init__")


def tick_map_broken(docstring: str) -> list[str]:
    """The names in backticks in the tick's map that name nothing."""
    return [cited for cited in CITED_CODE.findall(docstring) if not _tick_name_exists(cited)]


def test_the_tick_map_finds_names_that_no_longer_exist():
    docstring = """
    | `busy` | `BusyTick` | ... |
    1. `Producer.claim` builds the claim; `Pool.collect`, `Pool.flights`, `transitions.decide`,
       `Workers.pending`, `execute()`, `store.runs_claim_many` and `ctx.db` stand; `ctx.dbs`,
       `Pool.settle_everything`, `tick/busy.py` and `drain.SETTLE_WAIT` do not, unlike
       `tick/writer.py`, `cronjob.db.Database`, `--concurrency 1` and `async def`.
    """
    stale = ["busy", "BusyTick", "Producer.claim", "ctx.dbs", "Pool.settle_everything"]
    assert tick_map_broken(docstring) == [*stale, "tick/busy.py", "drain.SETTLE_WAIT"]


def test_the_tick_map_cites_only_parts_functions_and_files_that_exist():
    import cronjob.tick

    docstring = cronjob.tick.__doc__ or ""
    assert "The life of one run" in docstring
    assert tick_map_broken(docstring) == []


def test_the_tick_map_lists_every_module_of_the_tick_in_its_parts_table():
    import cronjob.tick

    rows = re.findall(r"^\| `(\w+)`", cronjob.tick.__doc__ or "", re.MULTILINE)
    assert sorted(rows) == sorted(["__init__", *_tick_modules()])
