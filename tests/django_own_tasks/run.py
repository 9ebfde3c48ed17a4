"""Run Django's own tests/tasks on jobrunner's backend, with Django's own runner.

    python -m tests.django_own_tasks.run DJANGO_TESTS_DIR

DJANGO_TESTS_DIR is the tests/ directory of the source distribution of the Django this
Python has installed. Its runtests.py installs the test app `tasks` as it always does,
with jobrunner's app (whose migrations make the test database's job tables) beside its
own; the backends its tests name are jobrunner's stand-ins (stand_ins.py). The database
is JOBRUNNER_DJANGO_TEST_DB's server; Django makes its test database there. Exits 0 when
every test passes.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile


def main(tests_dir: str) -> int:
    tmpdir = tempfile.mkdtemp(prefix="django_")
    tempfile.tempdir = os.environ["TMPDIR"] = tmpdir
    atexit.register(shutil.rmtree, tmpdir, ignore_errors=True)
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.django_own_tasks.settings"
    sys.path.insert(0, tests_dir)
    import runtests  # Django's, from tests_dir

    from tests.django_own_tasks import stand_ins

    runtests.ALWAYS_INSTALLED_APPS.append("cronjob.django")
    stand_ins.install()
    failures = runtests.django_tests(
        verbosity=2,
        interactive=False,
        failfast=False,
        keepdb=False,
        reverse=False,
        test_labels=["tasks"],
        debug_sql=False,
        parallel=1,
        tags=None,
        exclude_tags=None,
        test_name_patterns=None,
        start_at=None,
        start_after=None,
        pdb=False,
        buffer=False,
        timing=False,
        shuffle=False,
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
