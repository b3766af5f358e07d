#!/usr/bin/env python3
"""Entry point: ``python run.py COMMAND ...`` (the same as the ``runner`` console script)."""

import sys

from runner.cli import main

if __name__ == "__main__":
    sys.exit(main())
