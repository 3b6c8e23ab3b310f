"""taps-train: domain-specialized speculative-decoding drafters (EAGLE-2 / HASS), trained with Lightning."""

from taps_train.errors import TapsError

__all__ = ["TapsError"]
__version__ = "0.1.0"
