"""The argument parser of the package's three command lines (python -m ops, python -m models,
python -m driver).

argparse reports a usage mistake (no command, an unknown one, a missing or malformed option) on two
or more lines, the usage and then "PROG: error: ...", and exits by itself. Parser raises UsageError
instead, which each CLI prints as the one line every other user mistake gets, exit status 2:

    error: python -m ops: argument command: invalid choice: 'frob' (choose from ...) (usage: python -m ops ...)
"""

from __future__ import annotations

import argparse


class UsageError(Exception):
    """A command-line mistake; its message names the program and carries the usage, on one line."""


class Parser(argparse.ArgumentParser):
    def error(self, message):
        usage = " ".join(self.format_usage().split())  # argparse wraps a long usage over lines
        raise UsageError(f"{self.prog}: {message} ({usage})")
