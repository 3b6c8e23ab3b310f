"""`AcceptanceLengthCallback`: tree acceptance length τ measured during validation.

It decodes a few prompts per benchmark with the drafter being trained and the very decoder that
`taps-train eval` uses, and logs `val/tau/<benchmark>` and `val/tau`, so `ModelCheckpoint` can keep
the best drafter by what matters (τ) instead of by loss. Under DDP each rank decodes its share of
the prompts and the sums are reduced with torchmetrics before τ is formed. Its cost is bounded by
prompts x max_new_tokens and logged as `val/tau_seconds`.

Under DeepSpeed ZeRO-3 each rank holds 1/world of every drafter parameter, and calling the drafter's
modules outside the engine triggers collective fetches that ranks decoding different numbers of
prompts would not match. So the trained weights are gathered once into a plain drafter that shares
the verifier's embedding and head, and that copy decodes.
"""

import time

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torchmetrics import SumMetric

from taps_train.drafter import DrafterBackbone
from taps_train.drafter.checkpoint import drafter_from_checkpoint
from taps_train.eval.benchmarks import load_benchmark
from taps_train.eval.evaluate import run_benchmark
from taps_train.decoding.decoder import SpeculativeDecoder
from taps_train.decoding.tree import TreeConfig
from taps_train.verifier.generation import stop_token_ids


class AcceptanceLengthCallback(Callback):
    def __init__(
        self,
        benchmarks: list[str] = ["math_heldout", "chat_heldout"],  # noqa: B006 (jsonargparse needs a literal default)
        prompts_per_benchmark: int = 4,
        max_new_tokens: int = 48,
        temperature: float = 0.0,
        total_tokens: int = TreeConfig.total_tokens,
        depth: int = TreeConfig.depth,
        top_k: int = TreeConfig.top_k,
        every_n_validations: int = 1,
    ):
        """
        Args:
            benchmarks: benchmark names (see taps_train.eval.benchmarks) or name:path.
            prompts_per_benchmark: first N prompts of each benchmark, split across ranks.
            max_new_tokens: tokens generated per prompt turn.
            temperature: 0 for greedy verification, > 0 for sampling.
            total_tokens: tree size including the root.
            depth: EAGLE-2 depth (trees reach depth + 1 levels).
            top_k: children per expanded node.
            every_n_validations: measure on every n-th validation run (monitoring needs 1).
        """
        self.benchmarks = benchmarks
        self.prompts = prompts_per_benchmark
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.tree = TreeConfig(total_tokens, depth, top_k)
        self.every = every_n_validations
        self._runs = 0
        self._verifier = None
        self._tokenizer = None
        self._prompt_sets = None

    def _load(self, module: LightningModule) -> None:
        if self._verifier is None:
            loaded = module.frozen_verifier()  # on the module's device in its verifier_dtype, shared with online mode
            self._verifier = loaded.model
            self._tokenizer = loaded.tokenizer
            self._prompt_sets = {spec.split(":")[0]: load_benchmark(spec, self.prompts)[0] for spec in self.benchmarks}

    def measure(self, module: LightningModule, rank: int = 0, world_size: int = 1, seed: int = 0) -> dict[str, tuple[int, int]]:
        """(new tokens, verifier calls) per benchmark over this rank's share of the prompts."""
        self._load(module)
        was_training = module.drafter.training
        module.drafter.eval()
        decoder = SpeculativeDecoder(self._verifier, [_decoding_drafter(module.drafter, self._verifier)], self.tree, temperature=self.temperature,
                                     eos_token_ids=stop_token_ids(self._verifier, self._tokenizer))
        counts = {}
        for name, prompts in self._prompt_sets.items():
            tally = run_benchmark(decoder, self._tokenizer, prompts[rank::world_size], self.max_new_tokens, seed=seed, progress=False)
            counts[name] = (tally.new_tokens, tally.verify_calls)
        module.drafter.train(was_training)
        return counts

    def on_validation_epoch_end(self, trainer: Trainer, module: LightningModule) -> None:
        if trainer.sanity_checking:
            return
        self._runs += 1
        if (self._runs - 1) % self.every:
            return
        began = time.perf_counter()
        counts = self.measure(module, trainer.global_rank, trainer.world_size, seed=trainer.global_step)
        totals = {name: (_reduced_sum(new, module), _reduced_sum(calls, module)) for name, (new, calls) in counts.items()}
        for name, (new, calls) in totals.items():
            module.log(f"val/tau/{name}", new / calls.clamp_min(1), sync_dist=False)
        all_new = sum(new for new, _ in totals.values())
        all_calls = sum(calls for _, calls in totals.values())
        module.log("val/tau", all_new / all_calls.clamp_min(1), prog_bar=True, sync_dist=False)
        module.log("val/tau_seconds", torch.tensor(time.perf_counter() - began), sync_dist=False)


def _decoding_drafter(drafter: DrafterBackbone, verifier: torch.nn.Module) -> DrafterBackbone:
    """The drafter itself, or under ZeRO-3 (partitioned parameters carry `ds_id`) a whole copy of its
    trained weights gathered from all ranks, next to the verifier's own embedding and head."""
    if not any(hasattr(p, "ds_id") for p in drafter.parameters()):
        return drafter
    import deepspeed

    trained = {name: p for name, p in drafter.named_parameters() if p.requires_grad}
    with deepspeed.zero.GatheredParameters(list(trained.values())):
        weights = {f"drafter.{name}": p.detach().float().clone() for name, p in trained.items()}
    saved = drafter.state_dict().keys()  # token maps and other saved buffers are never partitioned
    weights.update({f"drafter.{name}": b.clone() for name, b in drafter.named_buffers() if name in saved})
    checkpoint = {"taps": {"drafter_config": drafter.config.to_dict()}, "state_dict": weights}
    return drafter_from_checkpoint(checkpoint, verifier, "the ZeRO-3 drafter being trained")


def _reduced_sum(value: int, module: LightningModule) -> torch.Tensor:
    """Sum over ranks (torchmetrics syncs on compute when distributed)."""
    metric = SumMetric().to(module.device)
    metric.update(torch.tensor(float(value), device=module.device))
    return metric.compute()
