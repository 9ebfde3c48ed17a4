import os
import sys

# `python -m cronjob` puts the current directory first on sys.path; the `jobrunner`
# script puts its own directory there instead. Without this, a handler module or an
# entry point (a *.dist-info) lying in whatever directory the command was started
# from would be imported by one and not the other. It comes too late for the modules
# Python and this package imported on the way here (runpy's contextlib, the package's
# typing...): those are looked for in that directory first, which `python -P -m cronjob`
# (or PYTHONSAFEPATH=1) alone prevents.
if sys.path and sys.path[0] in ("", os.getcwd()) and not sys.flags.safe_path:
    del sys.path[0]

from cronjob.cli import main

main()
