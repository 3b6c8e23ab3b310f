"""Where a speculative-decoding round's time goes, measured in one run on one verifier:

  (a) round breakdown: verifier tree forward, drafter forwards (layer + head), and bookkeeping (everything
      else: tree building, masks, acceptance, cache compaction). Target: bookkeeping <= 10% of a round.
  (b) tree forward of T tokens / the verifier's own forward of T causal tokens with a KV cache, same prefix,
      for T in --sizes. Target: <= 1.2.
  (c) with --cprofile: the functions behind the bookkeeping, top 25 by own time.
  (d) with --long-context: a --long-prompt-tokens prompt decoded for --long-new-tokens tokens (no stop token), each
      round timed with its context length. Round time at the longest contexts / round time at ~100 tokens of
      context, after subtracting the verifier's own growth between the two (its plain cached forward of the tree's
      token count at both lengths): what the decoder adds per round as the context grows. Target: <= 1.15, and
      bookkeeping <= 5% of the long run.

    python bench/round_profile.py --verifier smollm2-135m --drafter checkpoints/smol_eagle2_math/last.ckpt --long-context
    taps-train verifier standin checkpoints/standin     # random weights, Llama-3 shapes: 128k vocabulary, GQA, 8 x 1024
    python bench/round_profile.py --verifier checkpoints/standin --backbone eagle2 --long-context   # random drafter
"""

import argparse
import cProfile
import pstats
import statistics
import time
from contextlib import contextmanager

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache

from taps_train.drafter import build_drafter
from taps_train.drafter.checkpoint import load_drafter
from taps_train.drafter.eagle3 import eagle3_config
from taps_train.drafter.model import Drafter
from taps_train.eval.benchmarks import load_benchmark
from taps_train.eval.evaluate import first_turn_ids
from taps_train.decoding.decoder import SpeculativeDecoder
from taps_train.decoding.tree import TreeConfig, chain, pack
from taps_train.decoding.verify import BufferedLayer, VerifierSession
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
                synchronize()
                self.seconds[phase] += time.perf_counter() - began

        setattr(owner, name, timed)


def synchronize() -> None:
    """Wait for queued GPU work, so that wall-clock spans hold what they enclose (nothing on a CPU)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def random_drafter(backbone: str, verifier):
    config = verifier.config
    drafter = build_drafter(eagle3_config(config, 0.125) if backbone == "eagle3" else Drafter.config_for(config))
    drafter.load_verifier_parts(verifier)
    if backbone == "eagle3":
        drafter.set_vocabulary(torch.randperm(config.vocab_size)[: drafter.config.draft_vocab_size])
    return drafter.to(verifier.device).eval()


def crop(cache: DynamicCache, length: int) -> None:
    cache.crop(length - cache.get_seq_length())


def best_of(repeats: int, run) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        synchronize()
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
        model(input_ids=torch.tensor([prompt], device=model.device), cache=plain_cache, use_cache=True, logits_to_keep=1)
    ids = packed.input_ids[None].to(model.device)

    def plain_call():
        with torch.no_grad():
            model(input_ids=ids, cache=plain_cache, use_cache=True)
        crop(plain_cache, prefix)

    tree_call(), plain_call()  # warm-up
    return best_of(repeats, tree_call), best_of(repeats, plain_call)


def plain_call_seconds(model, ids: list[int], context: int, size: int, repeats: int) -> float:
    """Best-of-`repeats` seconds of the verifier's own causal forward of `size` tokens after `context` cached tokens,
    in the decoder's in-place cache (a `DynamicCache` would add a copy of the context to every call, which is not
    the attention's growth)."""
    cache = Cache(layer_class_to_replicate=BufferedLayer)
    with torch.no_grad():
        model(input_ids=torch.tensor([ids[:context]], device=model.device), cache=cache, use_cache=True, logits_to_keep=1)
    block = torch.tensor([ids[context : context + size]], device=model.device)

    def call():
        with torch.no_grad():
            model(input_ids=block, cache=cache, use_cache=True)
        crop(cache, context)

    call()
    return best_of(repeats, call)


def timed_rounds(decoder: SpeculativeDecoder, prompt: list[int], new_tokens: int) -> list[tuple[int, float]]:
    """(context length when the round began, its seconds) for every round of one generation."""
    rounds, context, last = [], len(prompt), [0.0]

    def on_round(stats) -> None:
        nonlocal context
        now = time.perf_counter()
        rounds.append((context, now - last[0]))
        context += stats.new_tokens
        last[0] = now

    model, wrapped = decoder.verifier, "forward" in vars(decoder.verifier)  # wrapped: a PhaseTimer's, kept
    original = model.forward

    def first_call(*args, **kwargs):  # the clock starts when the prefill ends
        out = original(*args, **kwargs)
        model.forward = original
        last[0] = time.perf_counter()
        return out

    model.forward = first_call
    decoder.generate(prompt, new_tokens, on_round=on_round)
    if not wrapped:
        del model.forward
    return rounds


def long_context(model, drafter, tree: TreeConfig, ids: list[int], args) -> None:
    """(d): round time against context length, net of the verifier's own attention growth."""
    decoder = SpeculativeDecoder(model, [drafter], tree, eos_token_ids=[])
    decoder.generate(ids[: args.short_prompt_tokens], 8)  # warm-up
    short = timed_rounds(decoder, ids[: args.short_prompt_tokens], args.short_new_tokens)
    timer = PhaseTimer()
    timer.wrap(model, "forward", "verifier")
    timer.wrap(drafter, "forward", "drafter")
    timer.wrap(drafter, "proposal_logits", "drafter")
    began = time.perf_counter()
    long = timed_rounds(decoder, ids[: args.long_prompt_tokens], args.long_new_tokens)
    total = time.perf_counter() - began
    del model.forward, drafter.forward, drafter.proposal_logits
    end = args.long_prompt_tokens + args.long_new_tokens
    late = [seconds for context, seconds in long if context >= end - args.window]
    early = [seconds for context, seconds in short]
    far = min(end - args.window // 2, len(ids) - tree.total_tokens)
    near = args.short_prompt_tokens + args.short_new_tokens // 2
    plain_near, plain_far = (plain_call_seconds(model, ids, c, tree.total_tokens, args.repeats) for c in (near, far))
    growth = plain_far - plain_near
    early_s, late_s = statistics.median(early), statistics.median(late)
    verifier_s, drafter_s = timer.seconds["verifier"], timer.seconds["drafter"]
    bookkeeping = total - verifier_s - drafter_s
    print(f"(d) long context: {len(long)} rounds over {args.long_prompt_tokens} -> {end} tokens of context, tree {tree}")
    print(f"    round at ~{near} tokens: {early_s * 1000:.1f} ms (median of {len(early)}), at ~{far} tokens: {late_s * 1000:.1f} ms "
          f"(median of {len(late)}); the verifier's own {tree.total_tokens}-token cached forward grows {plain_near * 1000:.1f} -> "
          f"{plain_far * 1000:.1f} ms")
    print(f"    round time at {far} / at {near}, net of the verifier's growth: {(late_s - growth) / early_s:.3f}  (target <= 1.15); "
          f"raw {late_s / early_s:.3f}")
    print(f"    long run: verifier {verifier_s / total:.1%}, drafter {drafter_s / total:.1%}, bookkeeping {bookkeeping / total:.1%}  "
          "(target <= 5%)")


def long_ids(tokenizer, benchmark: str, length: int) -> list[int]:
    """`length` token ids: benchmark prompts' opening turns, concatenated (repeated if need be)."""
    prompts = [first_turn_ids(tokenizer, p) for p in load_benchmark(benchmark, 50)[0]]
    ids = []
    while len(ids) < length:
        ids += [token for prompt in prompts for token in prompt]
    return ids[:length]


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
    parser.add_argument("--device", default="auto", help="the verifier's device, as taps-train eval's")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cprofile", action="store_true")
    parser.add_argument("--long-context", action="store_true", help="(d): round time against context length")
    parser.add_argument("--long-prompt-tokens", type=int, default=1000)
    parser.add_argument("--long-new-tokens", type=int, default=1000)
    parser.add_argument("--short-prompt-tokens", type=int, default=90)
    parser.add_argument("--short-new-tokens", type=int, default=40)
    parser.add_argument("--window", type=int, default=200, help="(d): rounds within this many tokens of the end count as long-context")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    verifier = load_verifier(args.verifier, args.device, args.verifier_dtype)
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
    if args.long_context:
        ids = long_ids(tokenizer, args.benchmark, args.long_prompt_tokens + args.long_new_tokens + tree.total_tokens)
        long_context(model, drafter, tree, ids, args)


if __name__ == "__main__":
    main()
