"""Drafter training: the EAGLE-2 and HASS LightningModules and their losses."""

from taps_train.training.modules import Eagle2Module, HassModule

__all__ = ["Eagle2Module", "HassModule"]
