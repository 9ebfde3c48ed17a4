"""Redaction, on any input: a secret in one of the shapes jobrunner knows never survives it,
wherever it stands in a text; and values made ready before they are encoded
(`text.json_ready`) always encode to one JSON document that PostgreSQL's jsonb takes.
Examples are derived deterministically, so every run of the suite tries the same ones."""

from __future__ import annotations

import contextlib
import copy
import json
import re
import string
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cronjob import text
from cronjob.text import json_ready, jsonb_accepts, redact, redact_value, remember_password

FAST = settings(max_examples=200, derandomize=True, deadline=None, database=None)
DATABASE = settings(
    max_examples=60,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

# Secrets are made of letters of their own, not found in what stands around them, so that
# one showing up after redaction is a leak, never a coincidence.
SECRET_CHARS = "QWXZJKVqwxzjkv"
# Whatever may stand around a secret: words, punctuation, quotes, escapes, line breaks,
# NUL, a lone surrogate, an astral character.
AROUND = "".join(c for c in string.ascii_letters if c not in SECRET_CHARS) + (
    string.digits + " \t\n.,;:=@/\\\"'{}[]()-_#?&%\x00\ud800\U0001f600é"
)
# Sampled, not an alphabet: a strategy's description shows its characters as they are, and
# Hypothesis cannot write a report that holds a lone surrogate.
around = st.text(alphabet=st.sampled_from(AROUND), max_size=30)
secret_word = st.text(alphabet=SECRET_CHARS, min_size=6, max_size=24)
# Anything a secret value may hold besides (not a blank: an unquoted value ends there).
secret_value = st.builds(
    lambda head, tail: head + tail,
    secret_word,
    st.text(alphabet=SECRET_CHARS + "!$%&*+-./:;<>?@^_|~0123456789", max_size=12),
)


def _spelled(word: str, cases: list[bool]) -> str:
    return "".join(c.upper() if up else c for c, up in zip(word, cases, strict=False))


SECRET_WORDS = [
    "password",
    "passwd",
    "passphrase",
    "token",
    "secret",
    "api_key",
    "api-key",
    "apikey",
    "api key",
    "access_key",
    "private_key",
    "credentials",
]
secret_name = st.builds(
    lambda prefix, word, cases, suffix: prefix + _spelled(word, cases) + suffix,
    st.text(alphabet=string.ascii_lowercase + "_", max_size=8),
    st.sampled_from(SECRET_WORDS),
    st.lists(st.booleans(), min_size=12, max_size=12),
    st.text(alphabet=string.ascii_lowercase + string.digits + "_.-", max_size=8),
)


@st.composite
def setting(draw: Any) -> tuple[str, str]:
    """`name=value`, `name: value`, a quoted value, a JSON or a Python field: the text, and
    the secret in it as it is written there."""
    name, value = draw(secret_name), draw(secret_value)
    form = draw(st.sampled_from(["=", " = ", ": ", ":", "quoted", "json", "python", "escaped"]))
    if form == "quoted":
        spaced = value + " " + draw(secret_word)
        quote = draw(st.sampled_from(["'", '"']))
        return f"{name}={quote}{spaced}{quote}", spaced
    if form == "json":
        return json.dumps({name: value}), value
    if form == "python":
        return repr({name: value}), value
    if form == "escaped":  # JSON inside a JSON string: its quotes escaped
        return json.dumps(json.dumps({name: value}))[1:-1], value
    return f"{name}{form}{value}", value


b64token = st.text(alphabet=string.ascii_letters + string.digits + "-._~+/", min_size=1)


@st.composite
def credentials(draw: Any) -> tuple[str, str]:
    """An Authorization header or a bearer token, and the secret in it."""
    token = (
        draw(secret_word)
        + draw(b64token.filter(lambda t: len(t) < 30))
        + "=" * draw(st.integers(0, 2))
    )
    scheme = draw(st.sampled_from(["Bearer", "bearer", "Basic", "Token", "Digest", "ApiKey"]))
    form = draw(st.sampled_from(["header", "json", "bearer"]))
    if form == "header":
        name = _spelled("authorization", draw(st.lists(st.booleans(), min_size=13)))
        return f"{name}: {scheme} {token}", token
    if form == "json":
        return json.dumps({"Authorization": f"{scheme} {token}"}), token
    return f"Bearer {token}", token


@st.composite
def aws_key(draw: Any) -> tuple[str, str]:
    """An AWS access key id, or a secret access key standing alone."""
    if draw(st.booleans()):
        prefix = draw(st.sampled_from(["AKIA", "ASIA", "AROA", "AIDA"]))
        key = prefix + draw(st.text(alphabet=string.ascii_uppercase + "234567", min_size=16))[:16]
        assume(len(key) == 20)
        return key, key
    alphabet = string.ascii_letters + string.digits + "+/"
    body = draw(st.text(alphabet=alphabet, min_size=38, max_size=38))
    key = draw(st.sampled_from(string.ascii_uppercase)) + body[:19] + "q" + body[19:]
    return key, key


@st.composite
def url_password(draw: Any) -> tuple[str, str]:
    """A URL with a password jobrunner was never told about."""
    password = draw(secret_word) + draw(st.text(alphabet="!$%&*+-.:;=?^_|~0123456789"))
    user = draw(st.text(alphabet=string.ascii_lowercase, min_size=1, max_size=8))
    scheme = draw(st.sampled_from(["postgresql", "postgres", "redis", "amqp", "https"]))
    return f"{scheme}://{user}:{password}@db.internal:5432/app", password


secret_in_a_shape = st.one_of(setting(), credentials(), aws_key(), url_password())


def _among(before: str, shaped: str, after: str) -> str:
    # A shape stands apart from what is around it by a blank, as in any text.
    return f"{before} {shaped} {after}"


@FAST
@given(before=around, shaped=secret_in_a_shape, after=around)
def test_a_secret_in_a_known_shape_never_survives_redaction(before, shaped, after):
    text, secret = shaped
    redacted = redact(_among(before, text, after))
    assert secret not in redacted
    assert json.dumps(secret)[1:-1] not in redacted


@FAST
@given(before=around, shaped=secret_in_a_shape, after=around)
def test_a_secret_in_a_logged_value_never_reaches_the_encoded_line(before, shaped, after):
    text, secret = shaped
    value = _among(before, text, after)
    line = json.dumps(json_ready({"event": value, "nested": [{"detail": value}]}))
    assert secret not in line and secret not in json.loads(line)["event"]


@FAST
@given(name=secret_name, secret=secret_value, number=st.integers())
def test_a_field_named_for_a_secret_is_hidden_whatever_it_holds(name, secret, number):
    event = {name: secret, "n": {name: number}, "ok": 1}
    assert json_ready(event) == {name: "***", "n": {name: "***"}, "ok": 1}
    assert redact_value(event) == {name: "***", "n": {name: "***"}, "ok": 1}


# Values a handler may log: anything JSON holds, and what it does not.
class _Odd:
    def __repr__(self) -> str:
        return "Odd('\x00\ud800 password=hunter2')"


leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**4000, max_value=10**4400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(),
    around,
    st.binary(max_size=10),
    st.builds(_Odd),
    st.just(float("nan")),
)
values = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(st.one_of(around, st.integers(), st.none()), inner, max_size=4),
    ),
    max_leaves=20,
)


def _strict(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise ValueError(constant)

    return json.loads(text, parse_constant=refuse)


@FAST
@given(value=values)
def test_a_value_made_ready_encodes_to_json_jsonb_takes(value):
    ready = json_ready(value)
    text = json.dumps(ready, ensure_ascii=False)  # no default: plain JSON types only
    assert _strict(text) == ready
    assert jsonb_accepts(text)
    text.encode("utf-8")  # no lone surrogate: any UTF-8 stream takes it


def test_a_value_nested_without_end_is_cut_not_recursed():
    deep: Any = "bottom"
    for _ in range(10_000):
        deep = [deep]
    loop: dict[str, Any] = {}
    loop["self"] = loop
    for value in (deep, loop):
        assert jsonb_accepts(json.dumps(json_ready(value)))


@DATABASE
@given(value=values)
def test_postgresql_stores_every_value_made_ready(conn, value):
    text = json.dumps(json_ready({"event": "x", "value": value}), ensure_ascii=False)
    stored = conn.execute("SELECT %s::jsonb", [text]).fetchone()[0]
    assert stored["event"] == "x"


@DATABASE
@given(text=st.text(alphabet='{}[]":,0123456789.eE-+ \\u0dDnNaIfty\x00\ud800' + "é", max_size=30))
def test_what_jsonb_accepts_postgresql_takes(conn, text):
    # jsonb_accepts errs on the side of refusing: whatever it accepts is stored.
    if jsonb_accepts(text):
        conn.execute("SELECT %s::jsonb", [text])


# A password with an unencoded @, cut by libpq into pieces however short.
PIECE_CHARS = "QWXZJKVqwxzjkv"


@FAST
@given(
    pieces=st.lists(st.text(alphabet=PIECE_CHARS, min_size=1, max_size=5), min_size=2, max_size=4),
    cuts=st.lists(st.sampled_from(["@", ":", "/", ","]), min_size=3, max_size=3),
)
def test_no_piece_of_a_password_with_an_at_is_quoted_however_short(pieces, cuts):
    password = pieces[0] + "".join(
        cut + piece for cut, piece in zip(["@", *cuts], pieces[1:], strict=False)
    )
    with _remembered(f"postgresql://app:{password}@db.invalid/app"):
        _assert_no_piece_quoted(password, pieces)


@contextlib.contextmanager
def _remembered(dsn: str) -> Iterator[None]:
    """`remember_password(dsn)` for a while: this process's other tests are not to lose
    words that are one letter long."""
    saved = {name: copy.copy(getattr(text, name)) for name in _PASSWORD_STATE}
    remember_password(dsn)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(text, name, value)
        text._READY_TEXTS.clear()
        text._READY_NAMES.clear()


_PASSWORD_STATE = ("_KNOWN_PASSWORDS", "_LONGEST_FIRST", "_SHORT_PIECES", "_SHORT_PIECES_PATTERN")


def _assert_no_piece_quoted(password: str, pieces: list[str]) -> None:
    for piece in pieces:
        # As libpq quotes the host, port or database a piece landed in.
        for message in (
            f'could not translate host name "{piece}@db.invalid" to address',
            f'invalid integer value "{piece}" for connection option "port"',
            f'database "{piece}" does not exist',
        ):
            redacted = redact(message)
            assert not re.search(rf"(?<!\w){re.escape(piece)}(?!\w)", redacted), (
                password,
                redacted,
            )


@pytest.mark.parametrize(
    "text",
    [
        "token" * 40_000,
        "token=" * 40_000,
        "token = " * 30_000,
        'password="' * 30_000,
        "password='\\" * 30_000,
        "xtoken" + "a" * 200_000,
        "authorization: " * 20_000,
        "Authorization: Bearer " * 15_000,
        "bearer " * 40_000,
        "AKIA" * 50_000,
        "Aa1/" * 50_000,
        ("Aa1" * 13 + " ") * 5_000,
        "\\" * 200_000,
        "api key: " * 20_000,
    ],
)
def test_redaction_of_secret_shapes_is_linear_in_the_text(text):
    import time

    started = time.perf_counter()
    redact(text)
    json_ready({"a": text})
    jsonb_accepts(json.dumps(text))
    # Quadratic patterns take minutes on these; linear ones well under a second.
    assert time.perf_counter() - started < 2.0
