"""Errors that the command line turns into one clear line (never a traceback)."""


class KvbenchError(Exception):
    """A user-facing problem: bad input, a missing model, an impossible request."""
