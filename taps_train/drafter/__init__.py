"""Drafter backbones: the interface every backbone offers, the EAGLE-1/2 drafter (shared by HASS) and the
EAGLE-3 drafter, and `build_drafter`, which makes any registered one from its config."""

from taps_train.drafter.backbone import BACKBONES, DrafterBackbone, backbone_class, build_drafter
from taps_train.drafter.config import drafter_config
from taps_train.features import FeatureContract
from taps_train.drafter.eagle3 import Eagle3Drafter
from taps_train.drafter.model import Drafter, KVCache

__all__ = ["BACKBONES", "Drafter", "Eagle3Drafter", "DrafterBackbone", "FeatureContract", "KVCache", "backbone_class", "build_drafter", "drafter_config"]
