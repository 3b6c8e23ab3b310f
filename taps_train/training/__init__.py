"""LightningModules that train drafters: one per backbone, over the shared `DrafterModule`."""

from taps_train.training.base import DrafterModule
from taps_train.training.eagle3 import Eagle3Module
from taps_train.training.modules import Eagle2Module, HassModule

__all__ = ["DrafterModule", "Eagle2Module", "Eagle3Module", "HassModule"]
