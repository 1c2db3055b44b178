"""`python -m rdmasched ...`: the same command line as the `rdmasched` script."""

import sys

from rdmasched.cli import main

if __name__ == "__main__":
    sys.exit(main())
