"""The feature contract: which verifier hidden states a drafter backbone reads, per token.

EAGLE-1/2 and HASS read one tensor, the verifier's post-norm last hidden state, which is both their
input and (through the LM head) their training target. EAGLE-3 reads a concatenation of three
intermediate layers and needs the post-norm last state as a separate target. The feature cache,
online training, the tree verifier and the training step all ask the contract instead of naming a
hidden state themselves, and the cache fingerprint includes it.

Layer indices are transformers' `hidden_states` indices: 0 is the embedding output, i the output of
decoder layer i, and -1 the final *post-norm* state (transformers ties it to `last_hidden_state`).
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

from taps_train.errors import TapsError

FEATURES = "features"  # the drafter's input feature per token
TARGETS = "targets"  # the verifier's post-norm last state, when it is not the input feature itself
LAST = -1


@dataclass(frozen=True)
class FeatureContract:
    """`layers`: the hidden states concatenated (in this order) into the drafter's input feature."""

    layers: tuple[int, ...] = (LAST,)

    @property
    def separate_targets(self) -> bool:
        """Training needs the post-norm last state next to the input feature (it is not the feature)."""
        return self.layers != (LAST,)

    @property
    def names(self) -> tuple[str, ...]:
        """The per-token tensors a cache stores and a batch carries."""
        return (FEATURES, TARGETS) if self.separate_targets else (FEATURES,)

    @property
    def hidden_state_indices(self) -> list[int]:
        """What to ask the verifier for (`output_hidden_states=`): only these are kept."""
        return sorted(set(self.layers) | {LAST}) if self.separate_targets else [LAST]

    def widths(self, hidden_size: int) -> dict[str, int]:
        """Per-token width of each named tensor."""
        return {FEATURES: hidden_size * len(self.layers), **({TARGETS: hidden_size} if self.separate_targets else {})}

    def fingerprint(self) -> str:
        """Names the stored hidden states in a cache fingerprint (the EAGLE-2 one predates this contract)."""
        if not self.separate_targets:
            return "last_hidden_state_post_norm"
        return f"hidden_states{list(self.layers)}+last_hidden_state_post_norm"

    def extract(self, hidden_states: Sequence[torch.Tensor | None]) -> dict[str, torch.Tensor]:
        """The named tensors from a verifier output's `hidden_states` ([..., H] each)."""
        features = torch.cat([hidden_states[i] for i in self.layers], dim=-1)
        return {FEATURES: features, TARGETS: hidden_states[LAST]} if self.separate_targets else {FEATURES: features}

    def targets(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        """The post-norm last state among `tensors` (what the verifier's LM head turns into its distribution)."""
        return tensors[TARGETS] if self.separate_targets else tensors[FEATURES]


EAGLE_FEATURES = FeatureContract()


def check_layers(contract: FeatureContract, verifier_config: PretrainedConfig, verifier: str) -> None:
    """Every layer the contract names exists in the verifier (hidden_states has num_hidden_layers + 1 entries)."""
    states = verifier_config.get_text_config(decoder=True).num_hidden_layers + 1
    outside = [i for i in contract.layers if not -states <= i < states]
    if outside:
        raise TapsError(f"the drafter reads verifier hidden states {list(contract.layers)}, but verifier {verifier} has {states} "
                        f"(indices {-states}..{states - 1}); {outside} do not exist: choose feature layers inside that range")
