"""`Eagle2Module` and `HassModule`: train a drafter against a frozen verifier.

Per position t the drafter reads (x_{t+1}, f_t) and predicts f̂_{t+1}; the LM head turns that into a
guess for x_{t+2}, so a position counts in the loss when x_{t+2} is an assistant token.

EAGLE-2: v_w * SmoothL1(f̂, f) + p_w * soft CE against the verifier's distribution head(f), with
uniform noise on the input features. HASS adds top-K distillation and *harmonized context alignment*:
`align_steps` forward passes per batch where step n feeds the drafter its own (detached) predictions
from step n-1 and attends to them for the most recent n-1 positions, as it will at inference.

Checkpoints hold only the trainable drafter weights, the drafter config and the verifier fingerprint.
"""

import math

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.strategies import DeepSpeedStrategy

from taps_train.drafter import Drafter, build_drafter
from taps_train.drafter.features import FEATURES
from taps_train.drafter.checkpoint import (
    check_verifier,
    load_drafter_weights,
    read_checkpoint,
)
from taps_train.errors import TapsError
from taps_train.training.losses import feature_loss, vocab_losses
from taps_train.verifier.fingerprint import verifier_fingerprint
from taps_train.verifier.loading import LoadedVerifier, load_verifier, read_verifier_files
from taps_train.verifier.placement import COMPUTE_DTYPE_CHOICES, training_dtype

SCHEDULES = ("cosine", "linear", "constant")
NOISE_SCALINGS = ("constant", "length")
ALIGN_REDUCTIONS = ("mean", "sum")


class Eagle2Module(LightningModule):
    def __init__(
        self,
        verifier: str = "taps-tiny",
        fc_bias: bool = False,
        feature_weight: float = 1.0,
        prob_weight: float = 0.1,
        topk_weight: float = 0.0,
        topk: int = 10,
        align_steps: int = 1,
        align_reduction: str = "mean",
        feature_noise: float = 0.2,
        noise_scaling: str = "constant",
        lr: float = 3e-5,
        betas: tuple[float, float] = (0.9, 0.95),
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        schedule: str = "constant",
        min_lr_ratio: float = 0.0,
        schedule_steps: int | None = None,
        accuracy_topk: int = 5,
        init_from: str | None = None,
        seed: int = 0,
        verifier_dtype: str = "auto",
        loss_chunk_size: int | None = 1024,
    ):
        """
        Args:
            verifier: `taps-tiny`, a local HF model directory, or a hub id (frozen; embed + head are reused).
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
            lr: peak learning rate (AdamW).
            betas: AdamW betas.
            weight_decay: AdamW weight decay.
            warmup_steps: linear warmup steps.
            schedule: after warmup: cosine, linear (both decay to min_lr_ratio * lr) or constant.
            min_lr_ratio: final learning rate as a fraction of `lr`.
            schedule_steps: the step at which warmup + decay end (the rate stays at `min_lr_ratio * lr` after it);
                None = the run's last step. EAGLE's training script fixes it whatever the run's length.
            accuracy_topk: k of the logged top-k accuracy.
            init_from: warm start: a taps-train checkpoint whose drafter weights to load (not its optimizer).
            seed: seed of the feature noise (per step, so resumed runs draw the same noise).
            verifier_dtype: compute dtype of the full verifier where training runs it (online features, the
                τ callback), on this module's device: auto (bfloat16 on CUDA, float32 on CPU), bfloat16,
                float16 or float32. The frozen embedding and LM head follow the trainer's precision instead.
            loss_chunk_size: positions per chunk of the vocabulary-sized loss terms (bounds their memory at
                large vocabularies; None = all positions at once). Values and gradients do not depend on it.
        """
        super().__init__()
        if schedule not in SCHEDULES:
            raise TapsError(f"unknown schedule {schedule!r}; use one of {SCHEDULES}")
        if align_steps < 1:
            raise TapsError(f"align_steps must be >= 1, got {align_steps}")
        if align_reduction not in ALIGN_REDUCTIONS:
            raise TapsError(f"unknown align_reduction {align_reduction!r}; use one of {ALIGN_REDUCTIONS}")
        if noise_scaling not in NOISE_SCALINGS:
            raise TapsError(f"unknown noise_scaling {noise_scaling!r}; use one of {NOISE_SCALINGS}")
        if schedule_steps is not None and schedule_steps < 1:
            raise TapsError(f"schedule_steps must be >= 1 (or null for the run's length), got {schedule_steps}")
        if verifier_dtype not in COMPUTE_DTYPE_CHOICES:
            raise TapsError(f"unknown verifier_dtype {verifier_dtype!r}; use one of {', '.join(COMPUTE_DTYPE_CHOICES)}")
        if loss_chunk_size is not None and loss_chunk_size < 1:
            raise TapsError(f"loss_chunk_size must be >= 1 (or null for no chunking), got {loss_chunk_size}")
        self.save_hyperparameters()
        # Only the config, the tokenizer and two tensors of the verifier: its layers are never built here,
        # so N ranks do not each hold an 8B model in host RAM before training starts.
        files = read_verifier_files(verifier)
        self.verifier_fingerprint = verifier_fingerprint(files.path, files.tokenizer)
        self.drafter = build_drafter(Drafter.config_for(files.config, fc_bias=fc_bias))
        self.drafter.use_verifier_parts(*files.read_parts())
        self._verifier: LoadedVerifier | None = None  # the full verifier, loaded on first need (online, τ callback)
        if init_from:
            self._warm_start(init_from)

    def setup(self, stage: str) -> None:
        if self.trainer is None:
            return
        self.drafter.cast_verifier_parts(training_dtype(self.trainer.precision))
        if isinstance(self.trainer.strategy, DeepSpeedStrategy):
            # Lightning refuses this too, but later (once the engine is set up) and without naming the fix.
            if self.trainer.gradient_clip_algorithm == "value":
                raise TapsError("DeepSpeed clips gradients by norm only (its gradient_clipping setting): set "
                                "trainer.gradient_clip_algorithm: norm, or use strategy: ddp to clip values as EAGLE and HASS do")
            # Checkpoints hold the trained drafter only (about 2 GB less per checkpoint at Llama-3-8B);
            # `load_state_dict` puts the frozen parts back on resume.
            self.trainer.strategy.exclude_frozen_parameters = True

    # --- features -------------------------------------------------------------------------

    def frozen_verifier(self) -> LoadedVerifier:
        """The full verifier on this module's device in `verifier_dtype`, loaded once per process and
        shared by online mode and the τ callback (never part of the module's state or checkpoints)."""
        if self._verifier is None:
            self._verifier = load_verifier(self.hparams.verifier, str(self.device), self.hparams.verifier_dtype)
        return self._verifier

    def batch_features(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The drafter's named per-token tensors (its feature contract): cached, or in online mode computed now
        by the frozen verifier."""
        contract = self.drafter.feature_contract()
        if FEATURES in batch:
            return {name: batch[name].float() for name in contract.names}
        with torch.no_grad():
            model = self.frozen_verifier().model
            out = model.base_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                   output_hidden_states=contract.hidden_state_indices)
            return {name: tensor.float() for name, tensor in contract.extract(out.hidden_states).items()}

    def _noise(self, features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """`features` [B, T, H] plus uniform noise of width `feature_noise`, or under `noise_scaling: length`
        `feature_noise * 512 / lengths[b]` for sample b (EAGLE and HASS add it per sample, before padding)."""
        generator = torch.Generator(device="cpu").manual_seed(self.hparams.seed * 1_000_003 + self.global_step)
        noise = torch.rand(features.shape, generator=generator).to(features.device, features.dtype)
        width = self.hparams.feature_noise
        if self.hparams.noise_scaling == "length":
            width = width * 512 / lengths.to(features.dtype)[:, None, None]
        return features + (noise - 0.5) * width

    # --- the forward passes -------------------------------------------------------------------

    def step_losses(self, batch: dict[str, torch.Tensor], train: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        tensors = self.batch_features(batch)
        ids, loss_mask = batch["input_ids"], batch["loss_mask"]
        next_ids, inputs = ids[:, 1:], tensors[FEATURES][:, :-1]
        targets = self.drafter.feature_contract().targets(tensors)[:, 1:]
        counts = torch.zeros_like(loss_mask[:, 1:])
        counts[:, :-1] = loss_mask[:, 2:]  # the position predicting x_{t+2} counts if x_{t+2} is an assistant token
        if not counts.any():  # every sample truncated before its reply: nothing to learn, keep the step
            zero = self.drafter.fc.weight.sum() * 0.0
            return zero, {"loss": zero}
        if train and self.hparams.feature_noise > 0:
            inputs = self._noise(inputs, batch["attention_mask"].sum(1))
        total, logs = 0.0, {}
        for step, predicted in enumerate(self.drafter.unroll(next_ids, inputs, self.hparams.align_steps), start=1):
            loss, step_logs = self._loss(predicted[counts], targets[counts])
            total = total + (loss if self.hparams.align_reduction == "sum" else loss / self.hparams.align_steps)
            logs.update({f"{name}_step{step}": value for name, value in step_logs.items()})
        logs["loss"] = total
        return total, logs

    def _loss(self, predicted: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Weighted loss and its logged terms; the vocabulary-sized terms run in chunks of positions."""
        h = self.hparams
        features = feature_loss(predicted, target).mean()
        vocab, terms = vocab_losses(predicted, target, self.drafter.lm_head.weight, h.prob_weight, h.topk_weight, h.topk,
                                    h.accuracy_topk, h.loss_chunk_size)
        return h.feature_weight * features + vocab, {"feature_loss": features, **terms}

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss, logs = self.step_losses(batch, train=True)
        if not torch.isfinite(loss):
            raise TapsError(
                f"non-finite training loss ({loss.item()}) at global step {self.global_step}, batch {batch_idx} of epoch "
                f"{self.current_epoch}; stopping. Earlier checkpoints are kept; lower lr or check the data/cache"
            )
        self.log_dict({f"train/{k}": v for k, v in logs.items()}, prog_bar=False, batch_size=batch["input_ids"].shape[0])
        self.log("train_loss", loss, prog_bar=True, batch_size=batch["input_ids"].shape[0], logger=False)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        _, logs = self.step_losses(batch, train=False)
        self.log_dict({f"val/{k}": v for k, v in logs.items()}, batch_size=batch["input_ids"].shape[0], sync_dist=True)
        self.log("val_loss", logs["loss"], prog_bar=True, batch_size=batch["input_ids"].shape[0], sync_dist=True, logger=False)

    # --- optimization ----------------------------------------------------------------------------

    def configure_optimizers(self):
        return self.configure_optimizers_for(int(self.trainer.estimated_stepping_batches))

    def configure_optimizers_for(self, total_steps: int) -> dict:
        """AdamW over the trainable drafter weights and the per-step warmup/decay schedule."""
        h = self.hparams
        trainable = [p for p in self.drafter.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=h.lr, betas=tuple(h.betas), weight_decay=h.weight_decay)
        total = max(1, h.schedule_steps or total_steps)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, total, h.warmup_steps, h.schedule, h.min_lr_ratio))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # --- checkpoints -------------------------------------------------------------------------------

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # DDP and single-device checkpoints: drop the frozen verifier parts here. DeepSpeed ignores this
        # state_dict and saves its engine's module instead, so `setup` turns on its exclude-frozen option.
        for name in self.drafter.frozen_parameter_names():
            checkpoint["state_dict"].pop(f"drafter.{name}", None)
        checkpoint["taps"] = {"drafter_config": self.drafter.config.to_dict(), "verifier": self.verifier_fingerprint}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self._check_compatible(checkpoint, "checkpoint")

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Checkpoints leave out the frozen verifier parts: this module's own stand in for them, so loading
        stays strict about every trained weight (Lightning and the DeepSpeed engine both load through here)."""
        frozen = {f"drafter.{name}": self.drafter.get_parameter(name) for name in self.drafter.frozen_parameter_names()}
        return super().load_state_dict({**frozen, **state_dict}, strict=strict, assign=assign)

    def _check_compatible(self, checkpoint: dict, where: str) -> None:
        if "taps" not in checkpoint:
            raise TapsError(f"{where} is not a taps-train drafter checkpoint (no 'taps' section)")
        check_verifier(checkpoint, self.verifier_fingerprint, where)

    def _warm_start(self, path: str) -> None:
        checkpoint = read_checkpoint(path)
        check_verifier(checkpoint, self.verifier_fingerprint, f"warm-start checkpoint {path}")
        load_drafter_weights(self.drafter, checkpoint, f"warm-start checkpoint {path}")


class HassModule(Eagle2Module):
    """HASS: EAGLE-2 training plus top-K distillation and harmonized context alignment.

    HASS's reference trains in two stages: `topk_weight: 0`, then `topk_weight: 1.0` at a lower `lr` with
    `init_from:` stage 1's checkpoint (configs/hass_*_stage1.yaml, configs/hass_*_stage2.yaml).
    """

    def __init__(self, align_steps: int = 3, topk_weight: float = 1.0, topk: int = 10, fc_bias: bool = True, **kwargs):
        super().__init__(align_steps=align_steps, topk_weight=topk_weight, topk=topk, fc_bias=fc_bias, **kwargs)


def lr_factor(step: int, total: int, warmup: int, schedule: str, min_ratio: float) -> float:
    """Learning-rate multiplier: linear warmup, then cosine / linear decay to `min_ratio`, or constant."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if schedule == "cosine" else 1 - progress
    return min_ratio + (1 - min_ratio) * shape
