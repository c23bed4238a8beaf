"""The one exception a user mistake raises: its message is a complete sentence the CLI prints as is."""

from __future__ import annotations


class DriverError(Exception):
    """Bad input (a folder, a prompt, an option): the CLI prints the message on one line and exits 2."""
