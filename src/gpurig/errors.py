"""Errors a user should see as one line, never as a traceback."""


class UsageError(Exception):
    """Bad user input (flags, files, impossible configurations): the CLI prints one line and exits 2."""
