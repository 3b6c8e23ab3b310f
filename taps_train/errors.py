"""One exception type for every user-facing failure.

The CLI prints a `TapsError` as a single line (what went wrong, where, and what to do) instead of a
traceback; anything else escaping is a bug in taps-train.
"""


class TapsError(Exception):
    """A problem with the user's input, files or environment, with the fix in its message."""


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (its type name when empty), for one-line errors."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
