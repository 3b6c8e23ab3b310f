"""Training-step benchmark on the tiny verifier, all figures measured in one run on the same batches:

  1. HASS step time / EAGLE-2 step time (3 alignment steps; target <= 3.3), and EAGLE-3's (7 passes)
  2. taps-train's Lightning training step / a bare PyTorch loop doing the same work (target <= 1.05)
  3. training throughput of each backbone (tokens/s)
  4. with --precision P: each backbone's Lightning step in P / in 32-true (e.g. bf16-mixed on a CPU with AVX512-BF16)

    python bench/train.py [--steps 30] [--recipe data_recipes/tiny_mixed.yaml]
    python bench/train.py --verifier smollm2-135m --recipe R --steps 8 --warmup 2 --rounds 1   # a real 30-layer LLM
    python bench/train.py --verifier smollm2-135m --recipe R --steps 8 --warmup 2 --backbones eagle2 --precision bf16-mixed
"""

import argparse
import time

import torch
from lightning.pytorch import Callback, Trainer
from torch.utils.data import DataLoader

from taps_train.data.datamodule import DrafterDataModule
from taps_train.training import Eagle2Module, Eagle3Module, HassModule

MODULES = {"eagle2": (Eagle2Module, {}), "hass": (HassModule, {}), "eagle3": (Eagle3Module, {"draft_vocab_size": 0.25})}


def fixed_batches(recipe: str, verifier: str, count: int, verifier_states: tuple[int, ...]) -> list[dict]:
    """The same samples for every backbone, with the verifier states its feature contract names."""
    data = DrafterDataModule(recipe, verifier=verifier, batch_size=8, max_tokens_per_batch=4096, verifier_states=verifier_states)
    data.prepare_data()
    data.setup("fit")
    return [batch for _, batch in zip(range(count), data.train_dataloader())]


def bare_loop_seconds(module, batches: list[dict], warmup: int) -> float:
    """Forward, backward, value clipping, AdamW and scheduler step: what the Trainer does per batch."""
    torch.manual_seed(0)
    config = module.configure_optimizers_for(len(batches))
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    module.train()
    for index, batch in enumerate(batches):
        if index == warmup:
            start = time.perf_counter()
        loss, _ = module.step_losses(batch, train=True)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_value_(module.parameters(), 0.5)
        optimizer.step()
        scheduler.step()
    return (time.perf_counter() - start) / (len(batches) - warmup)


class StepTimer(Callback):
    def __init__(self, warmup: int):
        self.warmup, self.start, self.end = warmup, None, None

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if batch_idx == self.warmup:
            self.start = time.perf_counter()

    def on_train_end(self, trainer, module):
        self.end = time.perf_counter()


def lightning_seconds(module, batches: list[dict], warmup: int, precision: str = "32-true") -> float:
    torch.manual_seed(0)
    timer = StepTimer(warmup)
    trainer = Trainer(accelerator="cpu", precision=precision, max_steps=len(batches), logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, gradient_clip_val=0.5, gradient_clip_algorithm="value", limit_val_batches=0,
                      num_sanity_val_steps=0, callbacks=[timer])
    trainer.fit(module, train_dataloaders=DataLoader(batches, batch_size=None, shuffle=False))
    return (timer.end - timer.start) / (len(batches) - warmup)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="data_recipes/tiny_mixed.yaml")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--verifier", default="taps-tiny", help="taps-tiny, smollm2-135m, a .gguf file or a model directory")
    parser.add_argument("--backbones", nargs="+", choices=list(MODULES), default=list(MODULES))
    parser.add_argument("--precision", help="also time each Lightning step in this precision (e.g. bf16-mixed) against 32-true")
    args = parser.parse_args()
    build = {name: lambda module_class=module_class, options=options: module_class(verifier=args.verifier, lr=1e-3, warmup_steps=5,
                                                                                   schedule="cosine", **options)
             for name, (module_class, options) in MODULES.items() if name in args.backbones}
    runners = {"bare": bare_loop_seconds, "lightning": lightning_seconds}
    if args.precision:
        runners[args.precision] = lambda module, batches, warmup: lightning_seconds(module, batches, warmup, args.precision)
    batches = {name: fixed_batches(args.recipe, args.verifier, args.steps, make().drafter.feature_contract().layers) for name, make in build.items()}
    first = next(iter(batches.values()))  # every backbone trains on the same samples
    tokens = sum(int(b["attention_mask"].sum()) for b in first[args.warmup :]) / (args.steps - args.warmup)
    timings = {}
    for round_index in range(args.rounds):  # alternate the runners; the fastest round of each counts
        for name, make in build.items():
            for runner_name, runner in runners.items():
                torch.manual_seed(0)
                module = make()
                if name == "eagle3":  # its vocabulary, as `setup` chooses it from the training data
                    vocab = module.drafter.config.vocab_size
                    module.choose_vocabulary(sum(torch.bincount(b["input_ids"][b["loss_mask"]], minlength=vocab)[:vocab] for b in batches[name]))
                seconds = runner(module, batches[name], args.warmup)
                timings[name, runner_name] = min(seconds, timings.get((name, runner_name), float("inf")))
                print(f"round {round_index} {name:7s} {runner_name:10s} {seconds:.3f} s/step  {tokens / seconds:,.0f} tok/s")
    print()
    for name, passes in (("hass", "3 alignment steps; target <= 3.3"), ("eagle3", "7 passes")):
        if name in build and "eagle2" in build:
            print(f"{name} / EAGLE-2 step time (bare loop, {passes}): {timings[name, 'bare'] / timings['eagle2', 'bare']:.2f}")
    for name in build:
        print(f"{name}: {tokens / timings[name, 'lightning']:,.0f} training tokens/s (Lightning)")
    for name in build:
        print(f"{name}: Lightning step / bare PyTorch step: {timings[name, 'lightning'] / timings[name, 'bare']:.3f}  (target <= 1.05)")
    if args.precision:
        for name in build:
            print(f"{name}: Lightning step in {args.precision} / in 32-true: {timings[name, args.precision] / timings[name, 'lightning']:.2f}")


if __name__ == "__main__":
    main()
