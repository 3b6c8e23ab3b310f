"""`Eagle2Module` and `HassModule`: train an EAGLE-1/2 drafter against a frozen verifier.

Per position t the drafter reads (x_{t+1}, f_t) and predicts f̂_{t+1}; the LM head turns that into a
guess for x_{t+2}, so a position counts in the loss when x_{t+2} is an assistant token.

EAGLE-2: v_w * SmoothL1(f̂, f) + p_w * soft CE against the verifier's distribution head(f), with
uniform noise on the input features. HASS adds top-K distillation and *harmonized context alignment*:
`align_steps` passes per batch where pass n feeds the drafter its own (detached) predictions from pass
n-1 (`Drafter.unroll`).

Checkpoints hold only the trainable drafter weights, the drafter config and the verifier fingerprint.
"""

import torch
from transformers import PretrainedConfig

from taps_train.drafter import Drafter, DrafterBackbone, build_drafter
from taps_train.drafter.config import check_vocab_size
from taps_train.features import FEATURES
from taps_train.errors import TapsError
from taps_train.ranges import float_problem, int_problem, require
from taps_train.training.base import DrafterModule
from taps_train.training.losses import feature_loss, vocab_losses
from taps_train.verifier.loading import DEFAULT_VERIFIER

NOISE_SCALINGS = ("constant", "length")
ALIGN_REDUCTIONS = ("mean", "sum")


class Eagle2Module(DrafterModule):
    drafter_class = Drafter
    study_rank = 0

    @classmethod
    def method_from(cls, hparams) -> str | None:
        """HASS is EAGLE-2 plus top-K distillation and context alignment: a module with either on trains HASS."""
        if "align_steps" not in hparams and "topk_weight" not in hparams:
            return None
        return "hass" if hparams.get("align_steps", 1) > 1 or hparams.get("topk_weight", 0.0) > 0 else "eagle2"

    def __init__(
        self,
        verifier: str = DEFAULT_VERIFIER,
        fc_bias: bool = False,
        feature_weight: float = 1.0,
        prob_weight: float = 0.1,
        topk_weight: float = 0.0,
        topk: int = 10,
        align_steps: int = 1,
        align_reduction: str = "mean",
        feature_noise: float = 0.2,
        noise_scaling: str = "constant",
        accuracy_topk: int = 5,
        seed: int = 0,
        proposal_vocab_size: int | float | None = None,
        **kwargs,
    ):
        """
        Args:
            verifier: `taps-tiny`, `smollm2-135m`, a .gguf file, a local HF model directory, or a hub id (frozen; embed + head are reused).
            fc_bias: bias in the fc layer (EAGLE's and HASS's training scripts: true; EAGLE's released Llama-3
                drafter: false).
            feature_weight: weight of the SmoothL1 feature loss.
            prob_weight: weight of the soft cross-entropy against the verifier's distribution.
            topk_weight: weight of HASS top-K distillation (0 disables it).
            topk: K of the top-K distillation.
            align_steps: HASS harmonized context alignment steps (1 = plain EAGLE training).
            align_reduction: how the steps' losses combine: mean, or sum as HASS's training script does (it
                backpropagates each step's loss on its own, so gradients are align_steps x larger before clipping).
            feature_noise: width of the uniform noise added to input features in training.
            noise_scaling: constant (width `feature_noise`) or length: `feature_noise * 512 / T` per sample, T its
                token count, as EAGLE's and HASS's training scripts draw it (wider noise on shorter samples).
            accuracy_topk: k of the logged top-k accuracy.
            seed: seed of the feature noise (per step, so resumed runs draw the same noise).
            proposal_vocab_size: drafting proposes only the training data's most frequent tokens: an int >= 1 is a
                count, a float in (0, 1] a fraction of the verifier's vocabulary; None: every token. Training and its
                loss keep the whole vocabulary; taps-train's decoder reads that many rows of the LM head per drafted
                level instead of all (exports drop it: engines draft EAGLE-1/2 over the whole vocabulary).
        """
        for name, problem in {
            **{f"model.{key}": float_problem(value, 0.0) for key, value in
               (("feature_weight", feature_weight), ("prob_weight", prob_weight), ("topk_weight", topk_weight), ("feature_noise", feature_noise))},
            "model.topk": int_problem(topk, 1, "at least 1"),
            "model.accuracy_topk": int_problem(accuracy_topk, 1, "at least 1"),
            "model.seed": int_problem(seed, 0, "a seed"),
        }.items():
            require(name, problem)
        if align_steps < 1:
            raise TapsError(f"model.align_steps must be >= 1, got {align_steps}")
        if align_reduction not in ALIGN_REDUCTIONS:
            raise TapsError(f"unknown model.align_reduction {align_reduction!r}; use one of {ALIGN_REDUCTIONS}")
        if noise_scaling not in NOISE_SCALINGS:
            raise TapsError(f"unknown model.noise_scaling {noise_scaling!r}; use one of {NOISE_SCALINGS}")
        if proposal_vocab_size is not None:
            check_vocab_size(proposal_vocab_size, "model.proposal_vocab_size")  # before the verifier is read
        super().__init__(verifier=verifier, **kwargs)

    def make_drafter(self, verifier_config: PretrainedConfig) -> DrafterBackbone:
        h = self.hparams
        return build_drafter(Drafter.config_for(verifier_config, fc_bias=h.fc_bias, proposal_vocab_size=h.proposal_vocab_size))

    def _noise(self, features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """`features` [B, T, H] plus uniform noise of width `feature_noise`, or under `noise_scaling: length`
        `feature_noise * 512 / lengths[b]` for sample b (EAGLE and HASS add it per sample, before padding)."""
        generator = torch.Generator(device="cpu").manual_seed(self.hparams.seed * 1_000_003 + self.global_step)
        noise = torch.rand(features.shape, generator=generator).to(features.device, features.dtype)
        width = self.hparams.feature_noise
        if self.hparams.noise_scaling == "length":
            width = width * 512 / lengths.to(features.dtype)[:, None, None]
        return features + (noise - 0.5) * width

    def step_losses(self, batch: dict[str, torch.Tensor], train: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        h = self.hparams
        features = self.batch_features(batch)[FEATURES]
        next_ids, inputs, targets = batch["input_ids"][:, 1:], features[:, :-1], features[:, 1:]
        counts = self.loss_positions(batch["loss_mask"])
        if not counts.any():
            return self.zero_loss()
        if train and h.feature_noise > 0:
            inputs = self._noise(inputs, batch["attention_mask"].sum(1))
        # Every alignment pass predicts the same targets: one vocabulary pass forms the verifier's distribution for all.
        predicted = torch.stack([passed[counts] for passed in self.drafter.unroll(next_ids, inputs, h.align_steps)])  # [S, N, H]
        target = targets[counts]
        feature_losses = feature_loss(predicted, target.expand_as(predicted)).mean(-1)
        vocab, terms = vocab_losses(predicted, target, self.drafter.lm_head.weight, h.prob_weight, h.topk_weight, h.topk,
                                    h.accuracy_topk, h.loss_chunk_size)
        losses = h.feature_weight * feature_losses + vocab  # [S], one per alignment pass
        logs = {f"{name}_step{step}": values[step - 1] for name, values in {"feature_loss": feature_losses, **terms}.items()
                for step in range(1, h.align_steps + 1)}
        logs["loss"] = losses.sum() if h.align_reduction == "sum" else losses.mean()
        return logs["loss"], logs


class HassModule(Eagle2Module):
    """HASS: EAGLE-2 training plus top-K distillation and harmonized context alignment.

    HASS's reference trains in two stages: `topk_weight: 0`, then `topk_weight: 1.0` at a lower `lr` with
    `init_from:` stage 1's checkpoint (configs/hass_*_stage1.yaml, configs/hass_*_stage2.yaml).
    """

    study_rank = 1

    def __init__(self, align_steps: int = 3, topk_weight: float = 1.0, topk: int = 10, fc_bias: bool = True, **kwargs):
        super().__init__(align_steps=align_steps, topk_weight=topk_weight, topk=topk, fc_bias=fc_bias, **kwargs)
