"""``python -m harombe``: the command line (see :mod:`harombe.cli`)."""

from __future__ import annotations

import sys

from harombe.cli import main

if __name__ == "__main__":
    sys.exit(main())
