import os
import sys

# `python -m cronjob` puts the current directory first on sys.path; the `jobrunner`
# script puts its own directory there instead. Without this, a handler module or an
# entry point (a *.dist-info) lying in whatever directory the command was started
# from would be imported by one and not the other.
if sys.path and sys.path[0] in ("", os.getcwd()) and not sys.flags.safe_path:
    del sys.path[0]

from cronjob.cli import main

main()
