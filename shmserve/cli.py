"""The entry point: `python -m shmserve.cli` and the `shmserve` script (pyproject.toml).

The command line itself is host/cli.py; this path stays so that every command line, unit
file and manifest that starts the server keeps working.
"""

import sys

from shmserve.host.cli import main

if __name__ == "__main__":
    sys.exit(main())
