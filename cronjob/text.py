"""Text safety, for every layer: passwords out of text, control characters escaped, and
one line out of many.

A leaf: it imports nothing of jobrunner, so the driver's adapter, the log and the
command line can all use it without depending on each other.
"""

from __future__ import annotations

import json
import os
import re

# Passwords jobrunner connects with, in every spelling they may take in a message:
# as written, percent-decoded, quoted and escaped. Replaced literally wherever text
# leaves the program or enters the database (`redact`).
_KNOWN_PASSWORDS: set[str] = set()
# The same, longest first, as `redact` replaces them: sorted once per new password, not per
# text (a tick redacts a line per event, and each event a run log keeps).
_LONGEST_FIRST: tuple[str, ...] = ()
# Shorter than this, a literal replacement would blot out ordinary words; the
# patterns below still catch such a password in a URL or a key=value string.
_MIN_LITERAL = 4

# Patterns for passwords jobrunner was not told about (a handler's own URL). Each
# character class excludes the character that ends it and the characters that can
# start another attempt, so no attempt backtracks and the scan is linear in the text.
_PASSWORD_IN_URL = r"(://[^:/@\s]*:)[^\s\"'/@]*@"
_PASSWORD_BARE = r"((?:^|[\s\"'(=])[^:/@\s\"'=(]+:)[^\s\"'/@=(]*@"
_PASSWORD_PARAM = r"(?i)(password\s*=\s*)(?:'(?:[^'\\]|\\.)*'?|\S+)"
# SQL's own spelling, in a statement someone's session ran (`ALTER ROLE app PASSWORD '...'`,
# as `status` may show it): a string literal, its quotes doubled inside.
_PASSWORD_LITERAL = r"(?i)(\bpassword\s+)'(?:[^']|'')*'?"
_PASSWORD_WORD = re.compile("password", re.IGNORECASE)


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
    global _LONGEST_FIRST
    _LONGEST_FIRST = tuple(sorted(_KNOWN_PASSWORDS, key=len, reverse=True))


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
        found.extend(_pieces_of_a_password_with_an_at(rest))
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


def _pieces_of_a_password_with_an_at(rest: str) -> list[str]:
    """The pieces of a URL's password written with an unencoded @ (`rest` is the URL after
    its `scheme://`). libpq ends the password at the first @ and reads what follows as
    the host, the port and the database, which its messages quote ("failed to resolve host
    'ss@db.example'" for `app:pa@ss@db.example`). The password is taken to end at the last
    @ before the query string, where its writer meant it to; an @ in the query string
    (`?options=...`) belongs to no password."""
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
    return [*_URL_FIELD_ENDS.split(password), *_URL_PART_ENDS.split(password)]


def redact(text: str) -> str:
    """`text` without passwords: the ones jobrunner knows, and any in a URL or a
    key=value connection string. Linear in the length of `text`."""
    for password in _LONGEST_FIRST:
        if password in text:
            text = text.replace(password, "***")
    # Each pattern needs an @ or the word password: most text (every log line of a
    # tick) has neither, and is not scanned further.
    if "@" in text:
        text = re.sub(_PASSWORD_IN_URL, r"\1***@", text)
        text = re.sub(_PASSWORD_BARE, r"\1***@", text)
    if _PASSWORD_WORD.search(text):
        text = re.sub(_PASSWORD_PARAM, r"\1***", text)
        text = re.sub(_PASSWORD_LITERAL, r"\1'***'", text)
    return text


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
