"""One exception type for every user-facing failure.

The CLI prints a `TapsError` as a single line (what went wrong, where, and what to do) instead of a
traceback; anything else escaping is a bug in taps-train.
"""


class TapsError(Exception):
    """A problem with the user's input, files or environment, with the fix in its message."""
