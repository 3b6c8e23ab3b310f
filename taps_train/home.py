"""Where taps-train keeps what it builds once and reuses (tiny verifier, feature caches)."""

import os
from pathlib import Path


def taps_home() -> Path:
    """`$TAPS_HOME`, else `$XDG_CACHE_HOME/taps-train`, else `~/.cache/taps-train`."""
    if "TAPS_HOME" in os.environ:
        return Path(os.environ["TAPS_HOME"]).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")).expanduser()
    return cache / "taps-train"
