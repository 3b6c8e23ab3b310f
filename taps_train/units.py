"""Quantities as people read them: durations and sizes in the unit that fits them."""


def duration(seconds: float) -> str:
    """`2h05m` past an hour, `3m07s` below it."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"
