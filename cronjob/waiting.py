"""Whether a tick has anything to do, asked before the tick machinery is imported.

The question is cronjob.store.tick_work_exists; this name stays until the command
that asks it imports it from there.
"""

from __future__ import annotations

from cronjob.store import tick_work_exists as work_waiting

__all__ = ["work_waiting"]
