"""The EAGLE-1/2 drafter (shared by HASS): a one-layer Llama-style head over verifier features."""

from taps_train.drafter.config import drafter_config
from taps_train.drafter.model import Drafter, KVCache

__all__ = ["Drafter", "KVCache", "drafter_config"]
