"""Which drafter a training run makes, EAGLE-2, HASS or EAGLE-3, read from its hyper-parameters.

W&B run tags and export provenance both name the backbone; they read it here so they always agree.
"""

from collections.abc import Mapping
from typing import Any


def backbone_name(hparams: Mapping[str, Any]) -> str | None:
    """`eagle3`, `hass` or `eagle2`; None when the hyper-parameters name no objective.

    Read from the objective, not the class: HASS is EAGLE-2 plus top-K distillation and context
    alignment, so a module with either switched on trains a HASS drafter.
    """
    if "draft_vocab_size" in hparams:
        return "eagle3"
    if "align_steps" not in hparams and "topk_weight" not in hparams:
        return None
    return "hass" if hparams.get("align_steps", 1) > 1 or hparams.get("topk_weight", 0.0) > 0 else "eagle2"
