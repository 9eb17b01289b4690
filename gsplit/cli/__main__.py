"""``python -m gsplit.cli ...``: the command line (as ``python -m gsplit``)."""

import sys

from gsplit.cli import main

if __name__ == "__main__":
    sys.exit(main())
