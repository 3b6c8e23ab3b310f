"""Quantities as people read them: durations and sizes in the unit that fits them."""


def duration(seconds: float) -> str:
    """`2h05m` past an hour, `3m07s` below it."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def size(count: float) -> str:
    """Bytes in the unit that fits: `512 B`, `3.4 kB`, `12.0 MB`, `1.25 GB` (decimal units, as disks are sold)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}" if count < 100 * scale else f"{count / scale:,.0f} {unit}"
    return f"{count:.0f} B"
