"""`DrafterModule`: what training any drafter backbone against a frozen verifier shares.

The verifier's embedding and LM head (frozen, shared with the drafter), its fingerprint, the features
of a batch (cached, or computed online as the backbone's feature contract says), AdamW with warmup and
decay (or Muon on the hidden matrices), checkpoints that hold only the trained drafter, and warm starts. A backbone's module builds its
drafter (`make_drafter`) and says what a batch's loss is (`step_losses`).
"""

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from lightning.pytorch import Callback, LightningModule
from lightning.pytorch.strategies import DeepSpeedStrategy
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from transformers import PretrainedConfig

from taps_train.drafter import DrafterBackbone
from taps_train.drafter.checkpoint import check_verifier, load_drafter_weights, read_checkpoint
from taps_train.drafter.config import most_frequent_tokens
from taps_train.features import FEATURES
from taps_train.machine import native_bf16, processor
from taps_train.errors import TapsError
from taps_train.ranges import float_problem, int_problem, require
from taps_train.training.optimizers import OPTIMIZERS, make_optimizer
from taps_train.training.progress import step_progress_bar
from taps_train.verifier.fingerprint import verifier_fingerprint
from taps_train.verifier.loading import DEFAULT_VERIFIER, LoadedVerifier, VerifierFiles, load_verifier, read_verifier_files
from taps_train.verifier.placement import COMPUTE_DTYPE_CHOICES, training_dtype

SCHEDULES = ("cosine", "linear", "constant")
LAYER_INITS = ("random", "verifier")  # where the drafter's decoder layer starts (model.layer_init)


def method_of(hparams: Mapping[str, Any]) -> str | None:
    """The training method a module's saved hyper-parameters name (W&B tags and export provenance read it here, so
    they always agree); None when no module recognizes them."""
    import taps_train.training  # noqa: F401  (every shipped module registers by subclassing)

    def modules(cls: type) -> list[type]:
        return [cls, *(sub for child in cls.__subclasses__() for sub in modules(child))]

    return next((name for module in modules(DrafterModule) if (name := module.method_from(hparams))), None)


class DrafterModule(LightningModule, ABC):
    drafter_class: type[DrafterBackbone]  # the network this module trains (each subclass names its backbone)
    # Where the method stands among its peers in a study's "later method beats earlier" claims (its paper's order);
    # None: not ranked.
    study_rank: ClassVar[int | None] = None

    @classmethod
    def method_from(cls, hparams: Mapping[str, Any]) -> str | None:
        """The training method (`eagle2`, `hass`, ...) these hyper-parameters (this module's, as saved) train; None
        when they are not this module's."""
        return None

    def __init__(
        self,
        verifier: str = DEFAULT_VERIFIER,
        optimizer: str = "adamw",
        lr: float = 3e-5,
        betas: tuple[float, float] = (0.9, 0.95),
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        schedule: str = "constant",
        min_lr_ratio: float = 0.0,
        schedule_steps: int | None = None,
        init_from: str | None = None,
        layer_init: str = "random",
        verifier_dtype: str = "auto",
        loss_chunk_size: int | None = 1024,
    ):
        """
        Args:
            verifier: `taps-tiny`, `smollm2-135m`, a .gguf file, a local HF model directory, or a hub id (frozen; embed + head are reused).
            optimizer: adamw, or muon: Muon on the drafter's hidden weight matrices and AdamW on the rest (norm gains,
                biases, a trained LM head), as speculators trains EAGLE-3; one rate and schedule for both (Muon's update
                is scaled to AdamW's size). Not under DeepSpeed, whose ZeRO flattens the matrices Muon needs.
            lr: peak learning rate.
            betas: AdamW betas (Muon keeps its momentum of 0.95).
            weight_decay: weight decay (both optimizers).
            warmup_steps: linear warmup steps.
            schedule: after warmup: cosine, linear (both decay to min_lr_ratio * lr) or constant.
            min_lr_ratio: final learning rate as a fraction of `lr`.
            schedule_steps: the step at which warmup + decay end (the rate stays at `min_lr_ratio * lr` after it);
                None = the run's last step. EAGLE's training script fixes it whatever the run's length.
            init_from: warm start: a taps-train checkpoint whose drafter weights to load (not its optimizer).
            layer_init: where the drafter's decoder layer starts: random, or verifier: a copy of the verifier's last
                decoder layer wherever a tensor's name and shape agree (the attention and MLP of a Llama-like verifier;
                EAGLE-3's attention reads twice the width, so its input projections stay random). A pretrained layer
                instead of noise, for a drafter that learns from little data.
            verifier_dtype: compute dtype of the full verifier where training runs it (online features, the
                τ callback), on this module's device: auto (bfloat16 on CUDA, float32 on CPU), bfloat16,
                float16 or float32. The frozen embedding and LM head follow the trainer's precision instead.
            loss_chunk_size: positions per chunk of the vocabulary-sized loss terms (bounds their memory at
                large vocabularies; None = all positions at once). Values and gradients do not depend on it.
        """
        super().__init__()
        for name, problem in {
            "model.lr": float_problem(lr, 0.0, what="a learning rate", above_minimum=True),
            "model.weight_decay": float_problem(weight_decay, 0.0),
            "model.warmup_steps": int_problem(warmup_steps, 0, "a step count"),
            "model.min_lr_ratio": float_problem(min_lr_ratio, 0.0, 1.0),
            **{f"model.betas[{i}]": float_problem(beta, 0.0, 1.0) for i, beta in enumerate(betas)},
        }.items():
            require(name, problem)
        if len(betas) != 2 or any(beta >= 1 for beta in betas):
            raise TapsError(f"model.betas {list(betas)} is out of range: need two values in [0, 1)")
        if optimizer not in OPTIMIZERS:
            raise TapsError(f"unknown model.optimizer {optimizer!r}; use one of {OPTIMIZERS}")
        if schedule not in SCHEDULES:
            raise TapsError(f"unknown model.schedule {schedule!r}; use one of {SCHEDULES}")
        if layer_init not in LAYER_INITS:
            raise TapsError(f"unknown model.layer_init {layer_init!r}; use one of {', '.join(LAYER_INITS)}")
        if layer_init != "random" and init_from:
            raise TapsError("model.layer_init and model.init_from both say where the drafter starts (init_from's weights "
                            "would replace the layer): give one")
        if schedule_steps is not None and schedule_steps < 1:
            raise TapsError(f"model.schedule_steps must be >= 1 (or null for the run's length), got {schedule_steps}")
        if verifier_dtype not in COMPUTE_DTYPE_CHOICES:
            raise TapsError(f"unknown model.verifier_dtype {verifier_dtype!r}; use one of {', '.join(COMPUTE_DTYPE_CHOICES)}")
        if loss_chunk_size is not None and loss_chunk_size < 1:
            raise TapsError(f"model.loss_chunk_size must be >= 1 (or null for no chunking), got {loss_chunk_size}")
        self.save_hyperparameters()  # with the subclass's own arguments (Lightning collects every __init__ frame)
        self.vocabulary_chosen = False
        # Only the config, the tokenizer and two tensors of the verifier: its layers are never built here,
        # so N ranks do not each hold an 8B model in host RAM before training starts.
        files = read_verifier_files(verifier)
        self.verifier_fingerprint = verifier_fingerprint(files.path, files.tokenizer)
        self.drafter = self.make_drafter(files.config)
        self.drafter.use_verifier_parts(*files.read_parts())
        if layer_init == "verifier":
            self._start_from_verifier_layer(files)
        self._verifier: LoadedVerifier | None = None  # the full verifier, loaded on first need (online, τ callback)
        self._trained_tokens: int | torch.Tensor = 0  # this rank's training tokens (padding excluded); a tensor, so no step waits on it
        if init_from:
            self._warm_start(init_from)

    @abstractmethod
    def make_drafter(self, verifier_config: PretrainedConfig) -> DrafterBackbone:
        """This module's (untrained) drafter for the verifier."""

    @abstractmethod
    def step_losses(self, batch: dict[str, torch.Tensor], train: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss of a batch and the terms to log."""

    def setup(self, stage: str) -> None:
        if self.trainer is None:
            return
        compute_dtype = training_dtype(self.trainer.precision)
        self.drafter.cast_verifier_parts(compute_dtype)
        if stage == "fit" and self.device.type == "cpu" and compute_dtype == torch.bfloat16 and not native_bf16():
            rank_zero_warn(f"trainer.precision {self.trainer.precision} on a CPU without AVX512-BF16 or AMX ({processor()}): bfloat16 "
                           "is emulated there, a step slower than in fp32; set trainer.precision: 32-true, or auto (bf16 where native)")
        data_contract = getattr(self.trainer.datamodule, "contract", None)
        if data_contract is not None and data_contract != self.drafter.feature_contract():
            raise TapsError(f"the datamodule provides verifier hidden states {list(data_contract.layers)} but the drafter reads "
                            f"{list(self.drafter.feature_contract().layers)}; set the datamodule's verifier_states to the drafter's "
                            "(`taps-train fit` links them)")
        if isinstance(self.trainer.strategy, DeepSpeedStrategy):
            # Lightning refuses this too, but later (once the engine is set up) and without naming the fix.
            if self.hparams.optimizer == "muon":
                raise TapsError("model.optimizer muon needs whole weight matrices, which DeepSpeed's ZeRO flattens and shards: "
                                "use model.optimizer: adamw with DeepSpeed, or strategy: ddp with muon")
            if self.trainer.gradient_clip_algorithm == "value":
                raise TapsError("DeepSpeed clips gradients by norm only (its gradient_clipping setting): set "
                                "trainer.gradient_clip_algorithm: norm, or use strategy: ddp to clip values as EAGLE and HASS do")
            # Checkpoints hold the trained drafter only (about 2 GB less per checkpoint at Llama-3-8B);
            # `load_state_dict` puts the frozen parts back on resume.
            self.trainer.strategy.exclude_frozen_parameters = True
        if stage == "fit" and self.drafter.chosen_vocabulary_size() is not None and not self.hparams.init_from and not self.vocabulary_chosen:
            counts = getattr(self.trainer.datamodule, "loss_token_counts", None)  # a resumed run loads its own over this one
            if counts is None:
                raise TapsError(f"{type(self).__name__} chooses its drafter's vocabulary from the training data: train it with a "
                                "DrafterDataModule, call choose_vocabulary(token counts) first, or warm-start it with init_from")
            self.choose_vocabulary(counts(self.drafter.config.vocab_size))

    def choose_vocabulary(self, counts: torch.Tensor) -> None:
        """The drafter proposes the `chosen_vocabulary_size()` most frequent tokens of `counts` (ties: lower id first)."""
        self.drafter.set_vocabulary(most_frequent_tokens(counts[: self.drafter.config.vocab_size], self.drafter.chosen_vocabulary_size()))
        self.vocabulary_chosen = True

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

    @staticmethod
    def loss_positions(loss_mask: torch.Tensor) -> torch.Tensor:
        """[B, T-1] bool: position t (reading x_{t+1}) counts when the token it guesses, x_{t+2}, is an assistant token."""
        counts = torch.zeros_like(loss_mask[:, 1:])
        counts[:, :-1] = loss_mask[:, 2:]
        return counts

    def zero_loss(self) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Every sample of the batch was truncated before its reply: nothing to learn, keep the step (and the graph)."""
        zero = self.drafter.fc.weight.sum() * 0.0
        return zero, {"loss": zero}

    # --- steps -------------------------------------------------------------------------------------

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self._trained_tokens = self._trained_tokens + batch["attention_mask"].sum()
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
        """The optimizer over the trainable drafter weights and the per-step warmup/decay schedule."""
        h = self.hparams
        optimizer = make_optimizer(h.optimizer, self.drafter, lr=h.lr, betas=tuple(h.betas), weight_decay=h.weight_decay)
        total = max(1, h.schedule_steps or total_steps)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, total, h.warmup_steps, h.schedule, h.min_lr_ratio))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def configure_callbacks(self) -> list[Callback]:
        """Lightning's stock progress bar, swapped for one that counts steps: runs bounded by `max_steps`
        otherwise read "Epoch 3/-2" (Lightning replaces a trainer callback of the type returned here)."""
        bar = step_progress_bar(self.trainer.progress_bar_callback)
        return [bar] if bar is not None else []

    # --- checkpoints -------------------------------------------------------------------------------

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # DDP and single-device checkpoints: drop the frozen verifier parts here. DeepSpeed ignores this
        # state_dict and saves its engine's module instead, so `setup` turns on its exclude-frozen option.
        for name in self.drafter.frozen_parameter_names():
            checkpoint["state_dict"].pop(f"drafter.{name}", None)
        checkpoint["taps"] = {"drafter_config": self.drafter.config.to_dict(), "verifier": self.verifier_fingerprint,
                              "trained_tokens": self.trained_tokens()}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self._check_compatible(checkpoint, "checkpoint")
        tokens = checkpoint["taps"].get("trained_tokens", 0)  # older checkpoints did not count
        if type(tokens) is not int or tokens < 0:
            raise TapsError(f"checkpoint: taps.trained_tokens is {tokens!r}, not a token count; the checkpoint is damaged "
                            "(resume from another, or start the run again)")
        self._trained_tokens = tokens // self._world_size()

    def trained_tokens(self) -> int:
        """Tokens (padding excluded) this run has trained on so far, over all ranks (each rank counts its own batches,
        assumed as large as the others'): the x axis of a learning curve (bench/learning_curves.py)."""
        return int(self._trained_tokens) * self._world_size()

    def _world_size(self) -> int:
        return self.trainer.world_size if self._trainer is not None else 1

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Checkpoints leave out the frozen verifier parts: this module's own stand in for them, so loading
        stays strict about every trained weight (Lightning and the DeepSpeed engine both load through here)."""
        frozen = {f"drafter.{name}": self.drafter.get_parameter(name) for name in self.drafter.frozen_parameter_names()}
        return super().load_state_dict({**frozen, **state_dict}, strict=strict, assign=assign)

    def _check_compatible(self, checkpoint: dict, where: str) -> None:
        """Before any state is loaded: a taps-train checkpoint of this verifier and of this module's drafter network."""
        if "taps" not in checkpoint:
            raise TapsError(f"{where} is not a taps-train drafter checkpoint (no 'taps' section)")
        check_verifier(checkpoint, self.verifier_fingerprint, where)
        check_backbone(checkpoint, self.drafter.config.architectures[0], bool(getattr(self.drafter.config, "fc_bias", False)), where,
                       type(self).__name__)
        trained, built = (self.drafter.variant_flags(config) for config in (checkpoint["taps"]["drafter_config"], self.drafter.config))
        if trained != built:
            raise TapsError(f"{where} was trained with {trained}, but this run builds {built}: the same weights computing another "
                            f"function; set those model options as it was trained")

    def _start_from_verifier_layer(self, files: VerifierFiles) -> None:
        name = self.drafter.decoder_layer
        if name is None:
            raise TapsError(f"model.layer_init: verifier: the {self.drafter.label} drafter has no decoder layer to start "
                            "from the verifier's; use layer_init: random")
        own = dict(self.drafter.get_submodule(name).named_parameters())
        verifier = files.read_last_layer()
        copied = [key for key, tensor in verifier.items() if key in own and own[key].shape == tensor.shape]
        if not copied:
            raise TapsError(f"model.layer_init: verifier: no tensor of verifier {files.path}'s last layer ({', '.join(verifier)}) "
                            f"has the name and shape of one of the drafter's layer; use layer_init: random")
        with torch.no_grad():
            for key in copied:
                own[key].copy_(verifier[key])
        left_random = [key for key in own if key not in copied]
        rank_zero_info(f"layer_init: verifier: the drafter's layer starts from the verifier's last layer's {', '.join(copied)}"
                       + (f"; random: {', '.join(left_random)}" if left_random else ""))

    def _warm_start(self, path: str) -> None:
        checkpoint = read_checkpoint(path)
        self._check_compatible(checkpoint, f"warm-start checkpoint {path}")
        load_drafter_weights(self.drafter, checkpoint, f"warm-start checkpoint {path}")


def check_backbone(checkpoint: dict, architecture: str, fc_bias: bool, where: str, module: str) -> None:
    """The checkpoint's drafter is the network `module` trains (architecture and fc bias), checked before any state loads."""
    trained = checkpoint["taps"].get("drafter_config") or {}
    theirs = (list(trained.get("architectures") or []), bool(trained.get("fc_bias", False)))
    if theirs != ([architecture], fc_bias):
        raise TapsError(f"{where} holds a {_network(*theirs)} drafter, but this {module} trains a {_network([architecture], fc_bias)} one; "
                        "use the config of the backbone it was trained with")


def _network(architectures: list, fc_bias: bool) -> str:
    return f"{'/'.join(map(str, architectures)) or 'unnamed'} ({'with' if fc_bias else 'without'} fc bias)"


def lr_factor(step: int, total: int, warmup: int, schedule: str, min_ratio: float) -> float:
    """Learning-rate multiplier: linear warmup, then cosine / linear decay to `min_ratio`, or constant."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if schedule == "cosine" else 1 - progress
    return min_ratio + (1 - min_ratio) * shape
