"""No task module: a script that sits in the project's directory, beside manage.py.

Importing it "wipes the cache": it writes the file JOBRUNNER_TEST_WIPE_MARKER names. The
Django tests check that no row (a run's or a schedule's job type) makes jobrunner import it.
"""

import os
from pathlib import Path

_marker = os.environ.get("JOBRUNNER_TEST_WIPE_MARKER")
if _marker:
    Path(_marker).write_text("wiped")
