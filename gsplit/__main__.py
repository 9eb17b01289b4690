"""``python -m gsplit ...``: the command line, also as torchrun starts it (``torchrun ... -m gsplit train``)."""

import sys

from gsplit.cli import main

if __name__ == "__main__":
    sys.exit(main())
