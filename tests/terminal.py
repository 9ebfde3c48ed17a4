"""`jobrunner` on a real pseudo-terminal, as an operator's shell starts it.

Its stdin and stderr are the terminal (its controlling terminal: Ctrl-C typed there is
the SIGINT the line discipline sends), its stdout a file, as with `jobrunner ... > out`.
What it writes to the terminal is read as it comes, by a thread of its own, so a command
never waits for the test to read.
"""

from __future__ import annotations

import fcntl
import os
import re
import struct
import tempfile
import termios
import threading
import time
from typing import Any

from tests.conftest import jobrunner_process

COLUMNS = 120


def _controlling_terminal() -> None:
    # In the child, a session leader by now (start_new_session): its stdin becomes the
    # session's controlling terminal, and its process group the terminal's foreground one.
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class OnTerminal:
    """One `jobrunner ARGS` process on a terminal of its own."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self._master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, COLUMNS, 0, 0))
        # Closed when the test leaves the `with` block (__exit__).
        self._stdout = tempfile.TemporaryFile("w+")  # noqa: SIM115
        self.process = jobrunner_process(
            *args,
            env={"TERM": "xterm", **(env or {})},
            stdin=slave,
            stdout=self._stdout,
            stderr=slave,
            start_new_session=True,
            preexec_fn=_controlling_terminal,
        )
        os.close(slave)
        self._seen = bytearray()
        self._changed = threading.Condition()
        self._closed = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self._master, 1 << 16)
            except OSError:  # EIO: the process and all its children closed the terminal
                data = b""
            with self._changed:
                if not data:
                    self._closed = True
                    self._changed.notify_all()
                    return
                self._seen += data
                self._changed.notify_all()

    @property
    def screen(self) -> str:
        """Everything written to the terminal so far."""
        with self._changed:
            return self._seen.decode(errors="replace")

    def wait_for(self, pattern: str, *, timeout: float = 30.0) -> re.Match[str]:
        """The first match of `pattern` in what the terminal shows, once it shows one."""
        until = time.monotonic() + timeout
        with self._changed:
            while True:
                found = re.search(pattern, self._seen.decode(errors="replace"))
                if found:
                    return found
                left = until - time.monotonic()
                if self._closed or left <= 0:
                    raise AssertionError(
                        f"the terminal never showed {pattern!r}; it shows:\n{self.screen!r}"
                    )
                self._changed.wait(left)

    def type(self, keys: bytes) -> None:
        """Keys typed at the terminal: b"\\x03" is Ctrl-C."""
        os.write(self._master, keys)

    def finish(self, timeout: float = 60.0) -> tuple[int, str]:
        """The exit code and stdout, once the process has ended and the terminal is drained."""
        code = self.process.wait(timeout=timeout)
        self._reader.join(timeout)
        self._stdout.seek(0)
        return code, self._stdout.read()

    def __enter__(self) -> OnTerminal:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._reader.join(5)
        os.close(self._master)
        self._stdout.close()
