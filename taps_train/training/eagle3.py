"""`Eagle3Module`: train an EAGLE-3 drafter against a frozen verifier.

Training-time test: the drafter is unrolled `ttt_steps` times on its own hidden states
(`Eagle3Drafter.unroll`); pass k at position t guesses x_{t+k+2}. Its loss is the cross-entropy
against the verifier's distribution at that position restricted to the draft vocabulary (softmax of
the verifier's logits over the draft tokens), over positions whose guessed token is an assistant
token and whose verifier top-1 lies in the draft vocabulary; passes are weighted 0.8^k as in EAGLE-3.
There is no feature-regression term. The draft vocabulary (the `draft_vocab_size` most frequent
assistant tokens of the training set) is chosen when training starts, unless warm-started.
"""

import torch
import torch.nn.functional as F
from transformers import PretrainedConfig

from taps_train.drafter import DrafterBackbone, Eagle3Drafter, build_drafter
from taps_train.drafter.config import check_vocab_size
from taps_train.drafter.eagle3 import TTT_STEPS, check_feature_layers
from taps_train.features import FEATURES
from taps_train.errors import TapsError
from taps_train.training.base import DrafterModule
from taps_train.verifier.loading import DEFAULT_VERIFIER


class Eagle3Module(DrafterModule):
    drafter_class = Eagle3Drafter
    study_rank = 2

    @classmethod
    def method_from(cls, hparams) -> str | None:
        return "eagle3" if "draft_vocab_size" in hparams else None

    def __init__(
        self,
        verifier: str = DEFAULT_VERIFIER,
        draft_vocab_size: int | float = 32000,
        feature_layers: tuple[int, ...] | None = None,
        ttt_steps: int = TTT_STEPS,
        step_weight_decay: float = 0.8,
        norm_before_fc: bool = False,
        norm_output: bool = False,
        **kwargs,
    ):
        """
        Args:
            verifier: `taps-tiny`, `smollm2-135m`, a .gguf file, a local HF model directory, or a hub id (frozen; its embedding is reused).
            draft_vocab_size: the drafter's own output vocabulary: an int >= 1 is a token count (capped at the
                verifier's vocabulary), a float in (0, 1] that fraction of the verifier's vocabulary (0.25: EAGLE-3's
                32k of Llama-3's 128k); 1 is one token, 1.0 the whole vocabulary. Checkpoints store the token count.
            feature_layers: the three verifier `hidden_states` fused by fc, distinct and ascending within 1..L-1 (the
                decoder-layer inputs engines capture); None: EAGLE-3's 2, L/2, L-3 (`default_feature_layers`).
            ttt_steps: training-time-test passes per batch.
            step_weight_decay: pass k's loss weight is step_weight_decay ** k.
            norm_before_fc: an RMSNorm on the fused verifier features before fc (vLLM and speculators serve it; SGLang
                does not, so its export refuses such drafters).
            norm_output: feed the normed hidden state to the next pass and draft step instead of the raw one (served
                as norm_before_fc is).
        """
        if ttt_steps < 1:
            raise TapsError(f"model.ttt_steps must be >= 1, got {ttt_steps}")
        if not 0 < step_weight_decay <= 1:
            raise TapsError(f"model.step_weight_decay must be in (0, 1], got {step_weight_decay}")
        check_vocab_size(draft_vocab_size, "draft_vocab_size")  # before the verifier is read
        super().__init__(verifier=verifier, **kwargs)

    def make_drafter(self, verifier_config: PretrainedConfig) -> DrafterBackbone:
        h, layers = self.hparams, verifier_config.get_text_config(decoder=True).num_hidden_layers
        feature_layers = check_feature_layers(h.feature_layers, layers) if h.feature_layers is not None else None
        return build_drafter(Eagle3Drafter.config_for(verifier_config, h.draft_vocab_size, feature_layers, h.norm_before_fc, h.norm_output))

    def _check_compatible(self, checkpoint: dict, where: str) -> None:
        """A resumed run fuses the layers its checkpoint was trained on: same shapes, other features, if the config (or
        the default for this verifier) names others."""
        super()._check_compatible(checkpoint, where)
        trained = list(checkpoint["taps"]["drafter_config"]["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
        if trained != list(self.drafter.feature_layers):
            raise TapsError(f"{where} was trained on verifier hidden states {trained}, but this run fuses "
                            f"{list(self.drafter.feature_layers)}; resume with the feature_layers it was trained on")

    def step_losses(self, batch: dict[str, torch.Tensor], train: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        tensors = self.batch_features(batch)
        next_ids = batch["input_ids"][:, 1:]
        counts = self.loss_positions(batch["loss_mask"])
        if not counts.any():
            return self.zero_loss()
        targets = self.drafter.feature_contract().targets(tensors)[:, 1:]  # index t: the verifier's state guessing x_{t+2}
        probabilities, in_draft = self._verifier_targets(targets[counts])
        row = counts.flatten().cumsum(0).view_as(counts) - 1  # each counted position's row of `probabilities`
        length = next_ids.shape[1]
        total, logs = 0.0, {}
        for step, predicted in enumerate(self.drafter.unroll(next_ids, tensors[FEATURES][:, :-1], self.hparams.ttt_steps)):
            lag = self.drafter.target_lag(step)
            where = counts[:, lag:]
            if not where.any():
                break  # every later pass guesses past the end of every sample
            rows = row[:, lag:][where]
            kept = in_draft[rows]
            loss, accuracy = self._loss(predicted[:, : length - lag][where][kept], probabilities[rows[kept]])
            total = total + self.hparams.step_weight_decay ** step * loss
            logs.update({f"loss_step{step}": loss.detach(), f"acc_step{step}": accuracy})
        logs["loss"] = total
        return total, logs

    @torch.no_grad()
    def _verifier_targets(self, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The verifier's distribution over the draft vocabulary at each counted position [M, D], and whether its
        top-1 is a draft token [M]. Once a step for every pass (pass k reads the positions from k on): the logits over
        the full vocabulary are the loss's largest product, in chunks of positions so that only one chunk of them
        (at Llama-3's 128k tokens the widest tensor of the step) is alive at a time."""
        drafter, chunk = self.drafter, self.hparams.loss_chunk_size or len(target)
        probabilities, in_draft = [], []
        for start in range(0, len(target), chunk):
            logits = F.linear(target[start:start + chunk].to(drafter.verifier_head.dtype), drafter.verifier_head).float()
            in_draft.append(drafter.t2d[logits.argmax(-1)])
            probabilities.append(logits[:, drafter.draft_token_ids].softmax(-1))
        return torch.cat(probabilities), torch.cat(in_draft)

    def _loss(self, predicted: torch.Tensor, probabilities: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Soft cross-entropy of the drafter's draft-vocabulary distribution against the verifier's, and the top-1
        agreement, means over the positions given (those whose verifier top-1 is a draft token); in chunks of
        positions, as the verifier's side."""
        chunk = self.hparams.loss_chunk_size or len(predicted) or 1
        losses, hits = [], 0
        for start in range(0, max(len(predicted), 1), chunk):
            log_q = self.drafter.draft_logits(predicted[start:start + chunk]).float().log_softmax(-1)
            p = probabilities[start:start + chunk]
            losses.append(-(p * log_q).sum())
            hits += int((log_q.argmax(-1) == p.argmax(-1)).sum())
        kept = max(len(predicted), 1)
        return torch.stack(losses).sum() / kept, torch.tensor(hits / kept)
