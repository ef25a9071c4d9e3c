"""``python -m histocal``: the histocal command line (see :mod:`histocal.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
