"""Where the database is: a flag, the environment, a file either names, a Django project's
settings, or else the embedded server.

Above both the connection (`cronjob.db`) and the places a URL can come from
(`cronjob.django.connection`, `cronjob.embedded`), which are imported only when asked.
"""

from __future__ import annotations

import os

from cronjob.text import remember_password

URL_FILE_ENV_VAR = "JOBRUNNER_DATABASE_URL_FILE"
# A URL file is read no further than this: any real URL fits many times over.
MAX_URL_FILE_BYTES = 4096


class GivenUrl(str):
    """A URL given on the command line, and the option that gave it (for the log)."""

    option: str

    def __new__(cls, url: str, option: str) -> GivenUrl:
        given = super().__new__(cls, url)
        given.option = option
        return given


def resolve_url(explicit: str | None) -> tuple[str, str]:
    """The database URL and where it came from, the first of: a flag (`--database-url`, or
    the file `--database-url-file` names), JOBRUNNER_DATABASE_URL, the file
    JOBRUNNER_DATABASE_URL_FILE names, a Django project's settings (with
    DJANGO_SETTINGS_MODULE set), DATABASE_URL, the embedded server. Sources after the
    first found are not read."""
    if explicit:
        remember_password(explicit)
        return explicit, getattr(explicit, "option", "--database-url")
    value = os.environ.get("JOBRUNNER_DATABASE_URL")
    if value:
        remember_password(value)
        return value, "JOBRUNNER_DATABASE_URL"
    path = os.environ.get(URL_FILE_ENV_VAR)
    if path:
        return read_url_file(path, source=URL_FILE_ENV_VAR), URL_FILE_ENV_VAR
    if django_project():
        # A Django project's own database, where enqueue writes its runs.
        from cronjob.django.connection import database_conninfo

        return database_conninfo(), "Django settings"
    value = os.environ.get("DATABASE_URL")
    if value:
        remember_password(value)
        return value, "DATABASE_URL"
    from cronjob import embedded

    return embedded.url(), "embedded"


def read_url_file(path: str, *, source: str) -> str:
    """The database URL in file `path` (a Docker or Kubernetes secret, say): its one line,
    without the newline that ends it. Anything else is BadInput naming `source` and the
    path, never the file's content, which holds a password. A file that others may write
    is read, with a warning: whoever can write it chooses the database jobrunner trusts.
    A file that others may read is not refused: secrets mounted for a container are 0444.
    """
    import stat

    from cronjob.errors import BadInput
    from cronjob.inputs import decode_text

    try:
        with open(path, "rb") as file:
            mode = os.fstat(file.fileno()).st_mode
            data = file.read(MAX_URL_FILE_BYTES + 1)
    except OSError as exc:
        raise BadInput(f"{source} {path!r}: cannot read it ({exc.strerror})") from None
    if len(data) > MAX_URL_FILE_BYTES:
        raise BadInput(f"{source} {path!r}: larger than {MAX_URL_FILE_BYTES} bytes")
    text = decode_text(data, source=f"{source} {path!r}")
    url = text[:-2] if text.endswith("\r\n") else text.removesuffix("\n")
    if not url.strip():
        raise BadInput(f"{source} {path!r}: is empty; it should hold the database URL")
    if any(not c.isprintable() for c in url):
        raise BadInput(
            f"{source} {path!r}: holds more than one line, or control characters; "
            "it should hold the database URL alone, on one line"
        )
    remember_password(url)
    if stat.S_ISREG(mode) and mode & (stat.S_IWGRP | stat.S_IWOTH):
        from cronjob import log

        log.log_event(
            "warning",
            "database URL file writable by others: whoever can write it chooses the database",
            path=path,
            mode=f"{stat.S_IMODE(mode):04o}",
        )
    return url


def django_project() -> bool:
    """DJANGO_SETTINGS_MODULE names a project's settings and Django is installed (a shell may
    export the variable to a jobrunner installed on its own): the database is the project's."""
    if not os.environ.get("DJANGO_SETTINGS_MODULE"):
        return False  # imports nothing more: the idle tick's path
    import importlib.util

    return importlib.util.find_spec("django") is not None
