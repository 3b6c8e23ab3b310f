"""Speculative-decoding benchmark on the tiny verifier, all figures from one run:

  (a) the AcceptanceLengthCallback's cost as a fraction of a tiny training epoch (target <= 0.10)
  (b) wall-clock speculative decoding vs plain greedy decoding of the verifier (honest ratio: the
      tiny verifier is about as cheap as the drafter, so this mostly shows the overhead)
  (c) τ of an oracle drafter proposing the verifier's own greedy tokens: the ceiling, which must be
      drafted levels + 1 = depth + 2 at T=0, apart from rounds cut short by the end of generation

    python bench/spec.py --drafter checkpoints/tiny_hass_mixed/last.ckpt
"""

import argparse
import time

import torch
from lightning.pytorch import Trainer

from taps_train.data.datamodule import DrafterDataModule
from taps_train.drafter.checkpoint import load_drafter
from taps_train.eval.benchmarks import load_benchmark
from taps_train.eval.callback import AcceptanceLengthCallback
from taps_train.eval.evaluate import first_turn_ids
from taps_train.decoding.decoder import SpeculativeDecoder
from taps_train.decoding.tree import DraftTree, TreeConfig, chain
from taps_train.training import HassModule
from taps_train.verifier.fingerprint import verifier_fingerprint
from taps_train.verifier.loading import load_verifier


def plain_greedy(model, ids: list[int], max_new_tokens: int, eos: list[int]) -> list[int]:
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), max_new_tokens=max_new_tokens,
                         do_sample=False, eos_token_id=eos, pad_token_id=eos[0])
    return out[0, len(ids):].tolist()


def oracle(reference: list[int], levels: int):
    """A strategy that ignores the drafter and proposes the next `levels` reference tokens as a chain."""

    def strategy(trees: list[DraftTree], config: TreeConfig):
        root = int(trees[0].tokens[0])
        emitted = strategy.emitted
        assert reference[emitted - 1] == root, "oracle lost track of the output"
        proposed = reference[emitted : emitted + levels]
        strategy.emitted += len(proposed) + 1
        return chain([root] + proposed), 0

    strategy.emitted = 1
    return strategy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafter", required=True, help="a checkpoint trained on the tiny verifier")
    parser.add_argument("--config-recipe", default="data_recipes/tiny_mixed.yaml")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    args = parser.parse_args()
    verifier = load_verifier("taps-tiny")
    drafter = load_drafter(args.drafter, verifier.model, verifier_fingerprint(verifier.path, verifier.tokenizer))
    eos = verifier.model.generation_config.eos_token_id
    tree = TreeConfig()

    # (a) callback cost vs one epoch of the tiny training run (same data and module as configs/tiny/hass_mixed.yaml)
    data = DrafterDataModule(args.config_recipe, batch_size=8, max_tokens_per_batch=4096)
    module = HassModule(verifier="taps-tiny", lr=3e-3)
    trainer = Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0)
    began = time.perf_counter()
    trainer.fit(module, datamodule=data)
    epoch_seconds = time.perf_counter() - began
    callback = AcceptanceLengthCallback()
    began = time.perf_counter()
    callback.measure(module)
    callback_seconds = time.perf_counter() - began
    print(f"(a) callback {callback_seconds:.1f} s / training epoch {epoch_seconds:.1f} s = {callback_seconds / epoch_seconds:.3f}  (target <= 0.10)")

    # (b) and (c) on held-out math and chat prompts
    prompts = load_benchmark("math_heldout", args.prompts)[0] + load_benchmark("chat_heldout", args.prompts)[0]
    spec_time = plain_time = 0.0
    spec_tokens = plain_tokens = 0
    oracle_new = oracle_calls = oracle_cut = 0
    for prompt in prompts:
        ids = first_turn_ids(verifier.tokenizer, prompt)
        began = time.perf_counter()
        reference = plain_greedy(verifier.model, ids, args.max_new_tokens, eos)
        plain_time += time.perf_counter() - began
        plain_tokens += len(reference)
        began = time.perf_counter()
        generation = SpeculativeDecoder(verifier.model, [drafter], tree).generate(ids, args.max_new_tokens)
        spec_time += time.perf_counter() - began
        spec_tokens += len(generation.tokens)
        assert generation.tokens == reference, "speculative output differs from greedy"
        ceiling = SpeculativeDecoder(verifier.model, [drafter], tree, strategy=oracle(reference, tree.levels)).generate(ids, args.max_new_tokens)
        assert ceiling.tokens == reference
        oracle_new += sum(r.new_tokens for r in ceiling.rounds)
        oracle_calls += len(ceiling.rounds)
        oracle_cut += sum(r.new_tokens < tree.levels + 1 for r in ceiling.rounds)
    print(f"(b) speculative {spec_tokens / spec_time:,.0f} tok/s vs plain greedy {plain_tokens / plain_time:,.0f} tok/s: "
          f"speed-up {plain_time / spec_time * spec_tokens / plain_tokens:.2f}x (outputs identical)")
    full_rounds = oracle_calls - oracle_cut
    print(f"(c) oracle τ = {oracle_new / oracle_calls:.2f} over {oracle_calls} rounds ({oracle_cut} cut short by the end of generation); "
          f"full rounds emit {tree.levels + 1} tokens = drafted levels {tree.levels} + 1 ({full_rounds} rounds)")


if __name__ == "__main__":
    main()
