"""A tasks module that ends its import with sys.exit(), as a script does."""

import sys

sys.exit(3)
