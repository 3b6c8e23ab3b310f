"""Range rules for numeric options, shared by every constructor and command that takes them: each returns the
problem as text (None when the value is fine) and `require` turns it into one line naming the option."""

import math

from taps_train.errors import TapsError


def int_problem(value: object, minimum: int, what: str) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        return f"{value!r} is out of range: need {what} (an integer >= {minimum})"
    return None


def float_problem(value: object, minimum: float, maximum: float = math.inf, what: str = "", above_minimum: bool = False) -> str | None:
    """A finite number in [minimum, maximum] (or (minimum, maximum] when `above_minimum`)."""
    low_ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and (
        value > minimum if above_minimum else value >= minimum)
    if not (low_ok and value <= maximum):
        bounds = f"{'>' if above_minimum else '>='} {minimum:g}" + (f" and <= {maximum:g}" if maximum != math.inf else "")
        return f"{value!r} is out of range: need {what + ' (' if what else ''}a finite number {bounds}{')' if what else ''}"
    return None


def require(name: str, problem: str | None) -> None:
    if problem:
        raise TapsError(f"{name} {problem}")
