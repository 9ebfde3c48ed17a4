"""What every section uses: logging progress, naming databases, telling failures apart."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import psycopg

from bench.suite.procs import CommandFailed

# What a failed measurement may raise; anything else is a bug in the harness.
MEASUREMENT_ERRORS = (
    CommandFailed,
    psycopg.Error,
    RuntimeError,
    OSError,
    subprocess.SubprocessError,
)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


def dbname(*parts: str) -> str:
    return re.sub(r"[^a-z0-9_]+", "_", "_".join(parts).lower())
