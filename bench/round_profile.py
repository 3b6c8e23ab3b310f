"""Where a speculative-decoding round's time goes, measured in one run on one verifier:

  (a) round breakdown: verifier tree forward, drafter forwards (layer + head), and bookkeeping (everything
      else: tree building, masks, acceptance, cache compaction). Target: bookkeeping <= 10% of a round.
  (b) tree forward of T tokens / the verifier's own forward of T causal tokens with a KV cache, same prefix,
      for T in --sizes. Target: <= 1.2.
  (c) with --cprofile: the functions behind the bookkeeping, top 25 by own time.

    python bench/round_profile.py --verifier smollm2-135m --drafter checkpoints/smol_eagle2_math/last.ckpt
    python bench/round_profile.py --verifier taps-standin --backbone eagle2     # random drafter, Llama-3 shapes
"""

import argparse
import cProfile
import pstats
import time
from contextlib import contextmanager

import torch
from transformers import DynamicCache

from taps_train.drafter import build_drafter
from taps_train.drafter.checkpoint import load_drafter
from taps_train.drafter.eagle3 import eagle3_config
from taps_train.drafter.model import Drafter
from taps_train.eval.benchmarks import load_benchmark
from taps_train.eval.evaluate import first_turn_ids
from taps_train.spec.decoder import SpeculativeDecoder
from taps_train.spec.tree import TreeConfig, chain, pack
from taps_train.spec.verify import VerifierSession
from taps_train.verifier.fingerprint import verifier_fingerprint
from taps_train.verifier.generation import stop_token_ids
from taps_train.verifier.loading import load_verifier


class PhaseTimer:
    """Seconds spent inside the verifier's and the drafters' calls, by wrapping them on the instances."""

    def __init__(self):
        self.seconds = {"verifier": 0.0, "drafter": 0.0}

    def wrap(self, owner, name: str, phase: str) -> None:
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            began = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - began

        setattr(owner, name, timed)


def random_drafter(backbone: str, verifier):
    config = verifier.config
    drafter = build_drafter(eagle3_config(config, 0.125) if backbone == "eagle3" else Drafter.config_for(config))
    drafter.load_verifier_parts(verifier)
    if backbone == "eagle3":
        drafter.set_draft_vocabulary(torch.randperm(config.vocab_size)[: drafter.config.draft_vocab_size])
    return drafter.eval()


def crop(cache: DynamicCache, length: int) -> None:
    cache.crop(length - cache.get_seq_length())


def best_of(repeats: int, run) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return min(times)


def tree_call_ratio(model, prompt: list[int], size: int, repeats: int) -> tuple[float, float]:
    """Best-of-`repeats` seconds of a tree forward of `size` tokens (a chain: same cost as any tree of that size)
    and of the model's own cached forward of `size` causal tokens, after the same prefix."""
    session = VerifierSession(model)
    session.prefill(torch.tensor(prompt))
    prefix = session.length
    packed = pack(chain(prompt[:size] if len(prompt) >= size else (prompt * size)[:size]), prefix)

    def tree_call():
        session.tree_forward(packed)
        crop(session.cache, prefix)

    plain_cache = DynamicCache()
    with torch.no_grad():
        model(input_ids=torch.tensor([prompt]), cache=plain_cache, use_cache=True, logits_to_keep=1)
    ids = packed.input_ids[None]

    def plain_call():
        with torch.no_grad():
            model(input_ids=ids, cache=plain_cache, use_cache=True)
        crop(plain_cache, prefix)

    tree_call(), plain_call()  # warm-up
    return best_of(repeats, tree_call), best_of(repeats, plain_call)


@contextmanager
def profiled(enabled: bool):
    profiler = cProfile.Profile() if enabled else None
    if profiler:
        profiler.enable()
    yield
    if profiler:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verifier", default="smollm2-135m")
    parser.add_argument("--drafter", default=None, help="a checkpoint trained on --verifier (default: a random --backbone drafter)")
    parser.add_argument("--backbone", default="eagle2", choices=["eagle2", "eagle3"])
    parser.add_argument("--benchmark", default="math_heldout")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--total-tokens", type=int, default=12)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 8, 16, 32, 60])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--verifier-dtype", default="auto", help="as taps-train eval's (auto: float32 on a CPU)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cprofile", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    verifier = load_verifier(args.verifier, dtype=args.verifier_dtype)
    model, tokenizer = verifier.model, verifier.tokenizer
    if args.drafter:
        drafter = load_drafter(args.drafter, model, verifier_fingerprint(verifier.path, verifier.tokenizer))
    else:
        drafter = random_drafter(args.backbone, model)
    prompts = [first_turn_ids(tokenizer, p) for p in load_benchmark(args.benchmark, args.prompts)[0]]
    tree = TreeConfig(args.total_tokens, args.depth, args.top_k)
    print(f"verifier {args.verifier} ({sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, {model.dtype}), "
          f"drafter {args.drafter or 'random ' + args.backbone}, tree {tree}, {torch.get_num_threads()} threads")

    decoder = SpeculativeDecoder(model, [drafter], tree, eos_token_ids=stop_token_ids(model, tokenizer))
    decoder.generate(prompts[0], 4)  # warm-up
    timer = PhaseTimer()
    timer.wrap(model, "forward", "verifier")
    timer.wrap(drafter, "forward", "drafter")
    timer.wrap(drafter, "proposal_logits", "drafter")  # what drafting calls (EAGLE-2's calls its logits inside)
    rounds, total = 0, 0.0
    with profiled(args.cprofile):
        for prompt in prompts:
            began = time.perf_counter()
            generation = decoder.generate(prompt, args.max_new_tokens)
            total += time.perf_counter() - began
            rounds += len(generation.rounds)
    del model.forward, drafter.forward, drafter.proposal_logits  # back to the class methods
    verifier_s, drafter_s = timer.seconds["verifier"], timer.seconds["drafter"]
    bookkeeping = total - verifier_s - drafter_s
    print(f"(a) {rounds} rounds, {total / rounds * 1000:.0f} ms per round (prefills included in the verifier share): "
          f"verifier {verifier_s / total:.1%}, drafter {drafter_s / total:.1%}, bookkeeping {bookkeeping / total:.1%}  (target <= 10%)")

    print("(b) tree forward vs the verifier's own cached forward of the same number of tokens")
    for size in args.sizes:
        tree_s, plain_s = tree_call_ratio(model, prompts[0], size, args.repeats)
        print(f"    T={size:3d}: tree {tree_s * 1000:7.1f} ms, plain {plain_s * 1000:7.1f} ms, ratio {tree_s / plain_s:.2f}  (target <= 1.2)")


if __name__ == "__main__":
    main()
