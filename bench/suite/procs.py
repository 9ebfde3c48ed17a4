"""Child processes: start together, time until the last exits, always clean up."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

# GNU time reports a child's own peak RSS. wait4() on a child forked from the
# harness cannot: a forked child starts with the harness's high-water mark, so
# anything smaller than the harness (~40 MiB) would read as the harness's size.
GNU_TIME = "/usr/bin/time"

# The same without GNU time, for one command: `python -c PEAK_OF ARGV...` runs ARGV (its
# stdout discarded, its stderr passed on), prints ARGV's own peak RSS in KiB and exits
# with ARGV's code. The command is forked from this fresh interpreter, not the harness.
PEAK_OF = (
    "import resource, subprocess, sys\n"
    "code = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    "sys.exit(code)\n"
)

# Every child still running; killed (by process group) when the run is interrupted.
_LIVE: dict[int, subprocess.Popen[bytes]] = {}
_LOCK = threading.Lock()
_SEQUENCE = itertools.count(1)


@dataclass(frozen=True)
class Command:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # added to os.environ
    cwd: str | None = None
    stdin: bytes | None = None

    def full_env(self) -> dict[str, str]:
        return {**os.environ, **self.env}


@dataclass(frozen=True)
class Exit:
    returncode: int
    seconds: float
    max_rss_kb: int
    log: Path


class CommandFailed(RuntimeError):
    pass


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def kill_all() -> None:
    with _LOCK:
        procs = list(_LIVE.values())
    for proc in procs:
        _kill_group(proc)


def tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def run_together(commands: list[Command], timeout: float, logdir: Path, tag: str) -> list[Exit]:
    """Start all commands at once; return when every one has exited.

    Each child's peak RSS comes from GNU time when installed, else from wait4().
    Output goes to <logdir>/<sequence>-<tag>.<i>.log. On timeout all of them are
    killed and CommandFailed is raised.
    """
    logdir.mkdir(parents=True, exist_ok=True)
    results: list[Exit | None] = [None] * len(commands)
    procs: list[subprocess.Popen[bytes]] = []
    threads: list[threading.Thread] = []
    start = time.perf_counter()

    use_time = os.access(GNU_TIME, os.X_OK)

    def reap(i: int, proc: subprocess.Popen[bytes], log: Path) -> None:
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        with _LOCK:
            _LIVE.pop(proc.pid, None)
        rss_kb = int(usage.ru_maxrss)
        if use_time:
            rss_kb = _time_rss(log.with_suffix(".rss"), rss_kb)
        results[i] = Exit(proc.returncode, elapsed, rss_kb, log)

    sequence = next(_SEQUENCE)
    try:
        for i, cmd in enumerate(commands):
            log = logdir / f"{sequence:04d}-{tag}.{i}.log"
            argv = cmd.argv
            if use_time:
                argv = [GNU_TIME, "-f", "%M", "-o", str(log.with_suffix(".rss")), *argv]
            with open(log, "wb") as out:
                proc = subprocess.Popen(
                    argv,
                    env=cmd.full_env(),
                    cwd=cmd.cwd,
                    stdin=subprocess.PIPE if cmd.stdin is not None else subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            with _LOCK:
                _LIVE[proc.pid] = proc
            procs.append(proc)
            thread = threading.Thread(target=reap, args=(i, proc, log), daemon=True)
            thread.start()
            threads.append(thread)
            if cmd.stdin is not None:
                threading.Thread(target=_feed, args=(proc, cmd.stdin), daemon=True).start()
    except BaseException:
        # One command could not start: do not leave the others running.
        for proc in procs:
            _kill_group(proc)
        raise

    deadline = start + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.perf_counter()))
    if any(t.is_alive() for t in threads):
        for proc in procs:
            _kill_group(proc)
        for thread in threads:
            thread.join(10)
        raise CommandFailed(f"{tag}: still running after {timeout:.0f}s, killed")
    return [r for r in results if r is not None]


def _time_rss(path: Path, fallback: int) -> int:
    try:
        return int(path.read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return fallback


def _feed(proc: subprocess.Popen[bytes], data: bytes) -> None:
    assert proc.stdin is not None
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass


def run_checked(cmd: Command, timeout: float, logdir: Path, tag: str) -> Exit:
    """Run one command to completion; raise CommandFailed with its log tail on error."""
    (result,) = run_together([cmd], timeout, logdir, tag)
    if result.returncode != 0:
        raise CommandFailed(
            f"{tag}: exit {result.returncode}: {' '.join(cmd.argv)}\n{tail(result.log)}"
        )
    return result
