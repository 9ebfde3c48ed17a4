"""Run the benchmark suite: `python bench/run.py [--quick] [--only drain,idle] ...`.

Use a Python that has psycopg 3 installed (the project's venv). Peers are
installed at run time under bench/.envs/. See bench/README.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script: make the repository root importable so `bench.*` resolves.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.suite.cli import main

if __name__ == "__main__":
    sys.exit(main())
