"""Text safety, for every layer: secrets out of text (`redact`) and out of structured values
(`json_ready` for what jobrunner encodes, `redact_value` for what another library does),
text PostgreSQL can store, control characters escaped, and one line out of many.

Redaction works on values, before they are encoded (JSON, COPY, HTML): a pattern applied
to encoded text can eat the quote that ends a string, and turn a valid line into an
invalid one.

A leaf: it imports nothing of jobrunner, so the driver's adapter, the log and the
command line can all use it without depending on each other.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

# Passwords jobrunner connects with, in every spelling they may take in a message:
# as written, percent-decoded, quoted and escaped. Replaced literally wherever text
# leaves the program or enters the database (`redact`).
_KNOWN_PASSWORDS: set[str] = set()
# The same, longest first, as `redact` replaces them: sorted once per new password, not per
# text (a tick redacts every text value it logs).
_LONGEST_FIRST: tuple[str, ...] = ()
# Shorter than this, a literal replacement would blot out ordinary words; the
# patterns below still catch such a password in a URL or a key=value string.
_MIN_LITERAL = 4
# The short pieces of a password written with an unencoded @ (see
# `_pieces_of_a_password_with_an_at`), replaced where they stand as a word of their own
# (`"ss@db"`, `port "w"`), never inside another word: libpq's messages quote the host, port
# or database they landed in, whatever their length.
_SHORT_PIECES: set[str] = set()
_SHORT_PIECES_PATTERN: re.Pattern[str] | None = None

# Patterns for passwords jobrunner was not told about (a handler's own URL). Each
# character class excludes the character that ends it and the characters that can
# start another attempt, so no attempt backtracks and the scan is linear in the text.
_PASSWORD_IN_URL = r"(://[^:/@\s]*:)[^\s\"'/@]*@"
_PASSWORD_BARE = r"((?:^|[\s\"'(=])[^:/@\s\"'=(]+:)[^\s\"'/@=(]*@"
# SQL's own spelling, in a statement someone's session ran (`ALTER ROLE app PASSWORD '...'`,
# as `status` may show it): a string literal, its quotes doubled inside.
_PASSWORD_LITERAL = re.compile(r"(?i)(\bpassword\s+)'(?:[^']|'')*'?")

# What names a secret: a key=value setting, a `key: value` header, a JSON or Python field.
# The name holds one of these words anywhere (`db_password`, `X-Auth-Token`,
# `AWS_SECRET_ACCESS_KEY`); what follows it is a secret up to the next blank, or the
# whole quoted string.
_SECRET_WORDS = (
    r"pass(?:word|wd|phrase)|token|secret|api[ _-]?key|access[_-]?key|private[_-]?key|credential"
)
SECRET_NAME = re.compile(_SECRET_WORDS, re.IGNORECASE | re.ASCII)
# The name's tail is bounded, so a text made of the same word many times over (`tokentoken…`)
# is scanned once per word, not to its end each time.
_SECRET_PARAM = re.compile(
    rf"((?:{_SECRET_WORDS})[\w.-]{{0,64}}(?:\\?[\"'])?\s*[:=]\s*)"
    r"(\"(?:[^\"\\]|\\.)*\"?|'(?:[^'\\]|\\.)*'?|\S+)",
    re.IGNORECASE | re.ASCII,
)
# An HTTP Authorization header (its scheme kept), and a bearer token anywhere.
_AUTHORIZATION = re.compile(
    r"(?ia)(\bauthorization(?:\\?[\"'])?\s*[:=]\s*(?:\\?[\"'])?(?:[a-z][\w-]{0,20}[ \t]+)?)"
    r"[^\s\"',;\\]+"
)
_BEARER = re.compile(r"(?ia)(\bbearer\s+)[\w.~+/-]+=*")


def _names_a_secret_maybe(lowered: str) -> bool:
    """Whether `lowered` holds a word the patterns above start at: most text (a tick's every
    log line) has none, and is not scanned further. `in` on lowered text is many times
    faster than a pattern; the patterns ignore ASCII case only, so none matches a text this
    turns down."""
    return (
        "pass" in lowered
        or "token" in lowered
        or "secret" in lowered
        or "key" in lowered
        or "credential" in lowered
        or "authorization" in lowered
        or "bearer" in lowered
    )


# AWS access key ids (long-term AKIA, temporary ASIA, and the other kinds of id), and
# secret access keys: 40 characters of base64's alphabet standing alone, upper and lower
# case mixed (a git commit id, hex in one case, is left alone).
_AWS_KEY_ID = re.compile(r"(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AIPA|ANPA|ANVA|APKA|AROA)[A-Z0-9]{16}")
_AWS_SECRET_KEY = re.compile(r"(?<![A-Za-z0-9/+])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")
_UPPER = re.compile(r"[A-Z]")
_LOWER = re.compile(r"[a-z]")


def remember_password(dsn: str) -> None:
    """Note the password in connection string `dsn` (URL or key=value), and PGPASSWORD,
    so that `redact` removes them from any text, even where no pattern would match."""
    from urllib.parse import unquote

    found = _passwords_in(dsn)
    env = os.environ.get("PGPASSWORD")
    if env:
        found.append(env)
    for password in found:
        for form in (password, unquote(password), password.replace("'", "\\'")):
            as_json = (json.dumps(form, ensure_ascii=ascii)[1:-1] for ascii in (False, True))
            for spelling in (form, *as_json, repr(form)[1:-1]):
                if len(spelling) >= _MIN_LITERAL:
                    _KNOWN_PASSWORDS.add(spelling)
    _SHORT_PIECES.update(p for p in _pieces_of_a_password_with_an_at(dsn) if len(p) < _MIN_LITERAL)
    global _LONGEST_FIRST, _SHORT_PIECES_PATTERN
    _READY_TEXTS.clear()
    _READY_NAMES.clear()
    _LONGEST_FIRST = tuple(sorted(_KNOWN_PASSWORDS, key=len, reverse=True))
    if _SHORT_PIECES:
        pieces = "|".join(map(re.escape, sorted(_SHORT_PIECES, key=len, reverse=True)))
        _SHORT_PIECES_PATTERN = re.compile(rf"(?<!\w)(?:{pieces})(?!\w)")


def _passwords_in(dsn: str) -> list[str]:
    """Every reading of the password in `dsn`, parseable or not: libpq ends a URL's
    password at the first @, its writer may have meant the last, and a value may be
    quoted."""
    found = []
    scheme, sep, rest = dsn.partition("://")
    if sep and " " not in scheme and "=" not in scheme:
        head = rest.rsplit("@", 1)[0] if "@" in rest else ""
        if ":" in head:
            found.append(head.split(":", 1)[1])
            first = rest.split("@", 1)[0]
            if ":" in first:
                found.append(first.split(":", 1)[1])
        found.extend(_pieces_of_a_password_with_an_at(dsn))
    for match in re.finditer(r"(?i)password\s*=\s*('(?:[^'\\]|\\.)*'?|\S+)", dsn):
        value = match.group(1)
        if value.startswith("'"):
            inner = value[1:-1] if len(value) > 1 and value.endswith("'") else value[1:]
            found.extend((inner, re.sub(r"\\(.)", r"\1", inner)))
        else:
            found.extend((value, re.sub(r"\\(.)", r"\1", value)))
            # A space ends an unquoted value for libpq, which then complains about
            # the words that follow it: they are the rest of the password.
            words = [value]
            for word in dsn[match.end(1) :].split():
                if "=" in word:
                    break
                words.append(word)
            found.extend([*words[1:], " ".join(words)])
    return [p for p in found if p]


# Where libpq cuts a URL into its parts (user, password, host, port, database): a password
# holding one of these is cut into pieces, each of which a message may quote on its own.
_URL_FIELD_ENDS = re.compile(r"[:/?,]")
_URL_PART_ENDS = re.compile(r"[@:/?#,]")


def _pieces_of_a_password_with_an_at(dsn: str) -> list[str]:
    """The pieces of a URL's password written with an unencoded @. libpq ends the password
    at the first @ and reads what follows as the host, the port and the database, which its
    messages quote ("failed to resolve host 'ss@db.example'" for `app:pa@ss@db.example`).
    The password is taken to end at the last @ before the query string, where its writer
    meant it to; an @ in the query string (`?options=...`) belongs to no password."""
    scheme, sep, rest = dsn.partition("://")
    if not sep or " " in scheme or "=" in scheme:
        return []
    at = rest.find("@")
    if at < 0:
        return []
    query = rest.find("?", at)
    head = (rest if query < 0 else rest[:query]).rsplit("@", 1)[0]
    if ":" not in head:
        return []
    password = head.split(":", 1)[1]
    if not _URL_PART_ENDS.search(password):
        return []  # in one piece: already found whole
    pieces = [*_URL_FIELD_ENDS.split(password), *_URL_PART_ENDS.split(password)]
    return [p for p in pieces if p]


def redact(text: str) -> str:
    """`text` without secrets: the passwords jobrunner knows; any password in a URL; the
    value of a setting, header or field whose name says it is a secret (`password=`,
    `token:`, `"api_key": "..."`, `AWS_SECRET_ACCESS_KEY=`); an `Authorization` header's
    credentials, a bearer token; AWS access key ids and secret keys. Linear in the length
    of `text`.

    Apply it to a value, before the value is encoded (as JSON, COPY, HTML): a pattern
    applied to encoded text may eat the quote that ends a string.
    """
    for password in _LONGEST_FIRST:
        if password in text:
            text = text.replace(password, "***")
    if _SHORT_PIECES_PATTERN is not None:
        text = _SHORT_PIECES_PATTERN.sub("***", text)
    # Each pattern needs an @, one of a few words, or a long enough text: most text (every
    # log line of a tick) has none, and is not scanned further.
    if "@" in text:
        text = re.sub(_PASSWORD_IN_URL, r"\1***@", text)
        text = re.sub(_PASSWORD_BARE, r"\1***@", text)
    if _names_a_secret_maybe(text.lower()):
        text = _AUTHORIZATION.sub(r"\1***", text)
        text = _BEARER.sub(r"\1***", text)
        text = _SECRET_PARAM.sub(_hidden_value, text)
        text = _PASSWORD_LITERAL.sub(r"\1'***'", text)
    if len(text) >= 20:
        text = _AWS_KEY_ID.sub("***", text)
        if len(text) >= 40:
            text = _AWS_SECRET_KEY.sub(_hidden_aws_secret, text)
    return text


def _hidden_value(match: re.Match[str]) -> str:
    # A JSON string stays one (`"token": "***"`); a libpq value loses its quotes, as before.
    return match.group(1) + ('"***"' if match.group(2).startswith('"') else "***")


def _hidden_aws_secret(match: re.Match[str]) -> str:
    key = match.group()
    # One that starts with a slash is taken for a path (in a traceback, say): such a key
    # is still removed after its name (`aws_secret_access_key=`).
    if key[0] == "/" or not (_UPPER.search(key) and _LOWER.search(key)):
        return key
    return "***"


def storable(text: str) -> str:
    """`text` as PostgreSQL's text and jsonb columns, and any UTF-8 stream, take it: a NUL
    written `\\x00`, an unpaired surrogate as its escape (`\\ud800`)."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


# The deepest nesting `json_ready` keeps: deeper values are shown as their kind.
MAX_DEPTH = 32
# Integers Python writes in decimal without refusing (it refuses over 4300 digits).
_LONGEST_INT_BITS = 10_000


def json_ready(value: Any) -> Any:
    """`value` as plain JSON types any encoder writes and PostgreSQL's jsonb takes, every
    text in it (keys too) redacted and `storable`: a value under a key that names a secret
    (`password`, `db_token`, `client_secret`...) is `***`; an object JSON has no type for is
    its `repr`; NaN and the infinities are text; an integer too long to write in decimal, a
    value nested deeper than `MAX_DEPTH`, or one whose `repr` raises is described instead.
    """
    return _ready(value, 0, False)


def _ready(value: Any, depth: int, secret: bool) -> Any:
    kind = type(value)
    if value is None or kind is bool:
        return value
    if secret:
        if isinstance(value, dict | list | tuple):
            return _container(value, depth, secret)
        return "***"
    if kind is str:
        return _ready_text(value)
    if kind is int:
        return value if value.bit_length() <= _LONGEST_INT_BITS else _long_int(value)
    if kind is float:
        return value if value - value == 0 else repr(value)  # NaN, inf: text, not JSON's
    if isinstance(value, dict | list | tuple):
        return _container(value, depth, secret)
    if isinstance(value, str):  # a str subclass (an enum's value): its text
        return _ready(str.__str__(value), depth, secret)
    if isinstance(value, int):  # an IntEnum: its number, as the encoder writes it
        return _ready(int.__int__(value), depth, secret)
    if isinstance(value, float):
        return _ready(float.__float__(value), depth, secret)
    return _ready(_repr(value), depth, secret)


def _container(value: Any, depth: int, secret: bool) -> Any:
    if depth >= MAX_DEPTH:
        return f"<{type(value).__name__} nested deeper than {MAX_DEPTH}>"
    depth += 1
    if isinstance(value, dict):
        items = {}
        for key, item in value.items():
            name, names_a_secret = _ready_name(key if type(key) is str else _key_text(key))
            items[name] = _ready(item, depth, secret or names_a_secret)
        return items
    return [_ready(item, depth, secret) for item in value]


# Texts a tick logs again and again (field names, job types, tenants, outcomes), ready: a
# dictionary lookup instead of a scan. Short texts only, and a bounded number of them;
# emptied when a new password is known.
_READY_TEXTS: dict[str, str] = {}
_READY_NAMES: dict[str, tuple[str, bool]] = {}
_CACHED_LENGTH = 64
_CACHED_TEXTS = 2048


def _ready_text(text: str) -> str:
    ready = _READY_TEXTS.get(text)
    if ready is None:
        ready = storable(redact(text))
        if len(text) <= _CACHED_LENGTH:
            if len(_READY_TEXTS) >= _CACHED_TEXTS:
                _READY_TEXTS.clear()
            _READY_TEXTS[text] = ready
    return ready


def _ready_name(name: str) -> tuple[str, bool]:
    """A field's name, ready, and whether it names a secret."""
    ready = _READY_NAMES.get(name)
    if ready is None:
        ready = (_ready_text(name), _names_a_secret_field(name))
        if len(name) <= _CACHED_LENGTH:
            if len(_READY_NAMES) >= _CACHED_TEXTS:
                _READY_NAMES.clear()
            _READY_NAMES[name] = ready
    return ready


def _key_text(key: Any) -> str:
    """A key that is not a text: a number, true, false or null as the JSON encoder writes
    it (`2` is "2"); anything else, its repr."""
    if key is None or isinstance(key, bool | int | float):
        ready = _ready(key, 0, False)
        return ready if isinstance(ready, str) else json.dumps(ready)
    return str.__str__(key) if isinstance(key, str) else _repr(key)


def _repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception:  # anyone's object: its repr may raise
        return f"<{type(value).__name__} whose repr raised>"


def _long_int(value: int) -> str:
    return f"<int of {value.bit_length()} bits>"


def redact_value(value: Any) -> Any:
    """`value` with every text in it redacted (`redact`), through dicts, lists and tuples,
    and a text or number under a key that names a secret (`password`, `token`,
    `authorization`...) replaced by `***`; everything else as it is (a datetime stays one):
    for a structure another library encodes (an error report). Nested deeper than
    `MAX_DEPTH`, a value is left out."""
    return _redacted(value, 0, False)


def _redacted(value: Any, depth: int, secret: bool) -> Any:
    if isinstance(value, str):
        return "***" if secret else redact(value)
    if isinstance(value, dict | list | tuple):
        if depth >= MAX_DEPTH:
            return f"<{type(value).__name__} nested deeper than {MAX_DEPTH}>"
        if isinstance(value, dict):
            return {
                redact(k) if isinstance(k, str) else k: _redacted(
                    v, depth + 1, secret or (isinstance(k, str) and _names_a_secret_field(k))
                )
                for k, v in value.items()
            }
        items = [_redacted(v, depth + 1, secret) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if secret and isinstance(value, int | float) and not isinstance(value, bool):
        return "***"
    return value


# Besides what SECRET_NAME matches, a field that holds credentials whole: an HTTP header's.
_SECRET_HEADER = re.compile(r"(?i)authorization|cookie")


def _names_a_secret_field(name: str) -> bool:
    return SECRET_NAME.search(name) is not None or _SECRET_HEADER.search(name) is not None


# An escape jsonb refuses (NUL, or half of a surrogate pair), where the backslash before it
# is not itself escaped: an even number of backslashes, none, before it.
_JSONB_REFUSED_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u(?:0000|[dD][89a-fA-F])")
# Longer numbers than these are refused here: PostgreSQL's numeric takes more, Python's
# parser may not, and no event made by `json_ready` holds one.
_LONGEST_NUMBER = 1_000


def jsonb_accepts(text: str) -> bool:
    """Whether PostgreSQL's jsonb takes `text`: valid UTF-8 and valid JSON, with no NaN or
    infinity, no \\u0000, no surrogate escapes, no number of thousands of digits. Errs on
    the side of refusing."""
    try:
        text.encode("utf-8")
        json.loads(text, parse_constant=_refused, parse_int=_number, parse_float=_number)
    except (ValueError, RecursionError):  # a UnicodeEncodeError is a ValueError
        return False
    return _JSONB_REFUSED_ESCAPE.search(text) is None


def _refused(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def _number(digits: str) -> int:
    if len(digits) > _LONGEST_NUMBER:
        raise ValueError("too long a number")
    return 0


# Control characters (C0, DEL, C1) and the bidirectional overrides that reorder what a
# terminal shows: a job type, tenant or error message is anyone's text, and must not
# move the cursor, recolour, retitle or rewrite the operator's screen.
_BIDI = [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_ESCAPES = {code: ascii(chr(code))[1:-1] for code in (*range(0x20), *range(0x7F, 0xA0), *_BIDI)}
_ESCAPES_KEEPING_NEWLINES = {code: s for code, s in _ESCAPES.items() if code != ord("\n")}


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """`text` with control characters written as escapes (`\\x1b`, `\\r`, `\\u202e`), for
    human-readable output; `--json` output stays exact."""
    return text.translate(_ESCAPES_KEEPING_NEWLINES if keep_newlines else _ESCAPES)


def one_line(text: str, *, limit: int | None = None, longest_word: int | None = None) -> str:
    """`text` on one line: each run of whitespace (line breaks among them) one space, none
    at either end.

    `limit`: at most that many characters, ending in "..." when cut; only about four
    times as many are read, so a message of megabytes costs no more than a short one.
    `longest_word`: a longer word is left out, not cut, and `[N characters]` shown in
    its place: no part of a value echoed whole, which may hold a password.
    """
    words = (text if limit is None else text[: limit * 4]).split()
    if longest_word is not None:
        words = [w if len(w) <= longest_word else f"[{len(w)} characters]" for w in words]
    line = " ".join(words)
    return line if limit is None or len(line) <= limit else line[: limit - 3] + "..."


# COPY's text format: a backslash starts an escape, a tab ends a column and a newline a row.
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def copy_text(text: str) -> str:
    """`text` as a column of COPY's text format."""
    if "\\" in text or "\t" in text or "\n" in text or "\r" in text:
        return text.translate(_COPY_ESCAPES)
    return text
