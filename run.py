#!/usr/bin/env python3
"""Entry point: ``python run.py COMMAND ...`` (the same as the ``runner`` console script)."""

from runner.cli import entry

if __name__ == "__main__":
    entry()
