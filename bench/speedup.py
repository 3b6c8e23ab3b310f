"""Wall-clock speedup over plain decoding, all methods in one run on the same prompts (T=0):

  - HF greedy: transformers' `generate(do_sample=False)`, the reference every ratio divides by
  - HF prompt lookup: transformers' own draft-free speculative method (`prompt_lookup_num_tokens=k`)
  - taps-train: speculative decoding with each drafter given, its tree chosen by `--tree auto` (or fixed); with `--tree auto`
    calibrated on one more prompt per benchmark than those timed, and rounds gated to plain decoding while speculation
    does not pay (taps_train/decoding/gate.py)

Methods run one after another on every prompt, the order rotating per prompt so that the machine's drift
cancels; every output is compared with HF greedy's token for token. Prints tokens/s per benchmark and method,
the ratio to HF greedy, whether the outputs were identical, and the complete T=0 check of every output (every token the
verifier's argmax after the tokens before it, or tied with it within its dtype's rounding: those counted).

    python bench/speedup.py --drafters checkpoints/smol_eagle2_math/best.ckpt checkpoints/smol_eagle3_math/best.ckpt
    python bench/speedup.py --device cuda --verifier-dtype bfloat16 --drafters ...   # the GPU path (bench/gpu_smoke.sh)
"""

import argparse
import time
from collections import defaultdict
from collections.abc import Callable

import torch

from taps_train.drafter.checkpoint import load_drafter
from taps_train.eval.benchmarks import load_benchmark
from taps_train.eval.evaluate import first_turn_ids
from taps_train.decoding.calibrate import calibrate_tree
from taps_train.decoding.decoder import SpeculativeDecoder
from taps_train.decoding.greedy_check import check_greedy_reply, not_lossless, too_many_ties
from taps_train.decoding.tree import TreeConfig
from taps_train.verifier.fingerprint import verifier_fingerprint
from taps_train.verifier.generation import stop_token_ids
from taps_train.verifier.loading import load_verifier

Method = Callable[[list[int]], list[int]]


def hf_generate(model, eos: list[int], max_new_tokens: int, **options) -> Method:
    def run(ids: list[int]) -> list[int]:
        prompt = torch.tensor([ids], device=model.device)
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=eos, pad_token_id=eos[0], **options)
        return out[0, len(ids):].tolist()

    return run


def speculative(decoder: SpeculativeDecoder, max_new_tokens: int) -> Method:
    return lambda ids: decoder.generate(ids, max_new_tokens).tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verifier", default="smollm2-135m")
    parser.add_argument("--drafters", nargs="+", required=True, help="checkpoints trained on --verifier")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--verifier-dtype", default="bfloat16")
    parser.add_argument("--benchmarks", nargs="+", default=["math_heldout", "chat_heldout"])
    parser.add_argument("--prompts", type=int, default=8, help="per benchmark")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--lookup-tokens", type=int, nargs="+", default=[3, 10], help="prompt_lookup_num_tokens values to try")
    parser.add_argument("--tree", default="auto", help="auto, or total_tokens,depth,top_k")
    parser.add_argument("--bound", default="60,5,10", help="--tree auto's search bound: total_tokens,depth,top_k")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    verifier = load_verifier(args.verifier, args.device, args.verifier_dtype)
    model, tokenizer = verifier.model, verifier.tokenizer
    eos = stop_token_ids(model, tokenizer)
    loaded = {name: [first_turn_ids(tokenizer, p) for p in load_benchmark(name, args.prompts + 1)[0]] for name in args.benchmarks}
    benchmarks = {name: prompts[: args.prompts] for name, prompts in loaded.items()}
    calibration_prompts = [ids for prompts in loaded.values() for ids in prompts[args.prompts :]]  # never a timed prompt
    print(f"verifier {args.verifier} ({model.dtype}, {model.device}), {torch.get_num_threads()} threads, "
          f"{args.prompts} prompts per benchmark, {args.max_new_tokens} new tokens, T=0")

    methods: dict[str, Method] = {"HF greedy": hf_generate(model, eos, args.max_new_tokens)}
    for k in args.lookup_tokens:
        methods[f"HF prompt lookup k={k}"] = hf_generate(model, eos, args.max_new_tokens, prompt_lookup_num_tokens=k)
    fingerprint = verifier_fingerprint(verifier.path, tokenizer)
    for path in args.drafters:
        drafter = load_drafter(path, model, fingerprint)
        gate = None
        if args.tree == "auto":
            calibration = calibrate_tree(model, drafter, calibration_prompts, set(eos), TreeConfig(*map(int, args.bound.split(","))))
            tree, gate = calibration.choice.tree, calibration.gate()
            curve = ", ".join(f"{size}: {ms:.0f}" for size, ms in calibration.costs.call_ms.items())
            print(f"{path}: --tree auto chose {tree} (expected τ {calibration.choice.expected_tau:.2f}, "
                  f"{calibration.choice.round_ms:.0f} ms per round; speculation gate {gate}); call ms by tokens (monotone fit) {{{curve}}}")
        else:
            tree = TreeConfig(*map(int, args.tree.split(",")))
        decoder = SpeculativeDecoder(model, [drafter], tree, eos_token_ids=eos, gate=gate)
        methods[f"taps-train {path} {tree.total_tokens}/{tree.depth}/{tree.top_k}"] = speculative(decoder, args.max_new_tokens)

    names = list(methods)
    for method in methods.values():  # warm-up
        method(next(iter(benchmarks.values()))[0][:64])
    tokens = defaultdict(int)
    seconds = defaultdict(float)
    identical, ties, checked = defaultdict(int), defaultdict(int), defaultdict(int)
    for name, prompts in benchmarks.items():
        for index, ids in enumerate(prompts):
            order = names[index % len(names):] + names[: index % len(names)]
            outputs = {}
            for method in order:
                began = time.perf_counter()
                outputs[method] = methods[method](ids)
                seconds[name, method] += time.perf_counter() - began
                tokens[name, method] += len(outputs[method])
            for method in names:  # untimed: the complete T=0 check of every method's output (ties counted, a divergence stops)
                identical[name, method] += outputs[method] == outputs["HF greedy"]
                check = check_greedy_reply(model, ids, outputs[method], set(eos), args.max_new_tokens)
                if check.divergence is not None:
                    raise not_lossless(f"{name}, prompt {index + 1}", method, check.divergence)
                ties[name, method] += check.ties
                checked[name, method] += check.tokens

    for (name, method), count in ties.items():  # as taps-train eval: more ties than plain decoding's explain is an error
        problem = too_many_ties(f"{name}, {method}", count, checked[name, method], (ties[name, "HF greedy"], checked[name, "HF greedy"]))
        if problem and method != "HF greedy":
            raise SystemExit(f"bench/speedup.py: {problem}")

    width = max(map(len, names))
    for name, prompts in benchmarks.items():
        greedy = tokens[name, "HF greedy"] / seconds[name, "HF greedy"]
        print(f"\n{name} ({len(prompts)} prompts)")
        print(f"  {'method':<{width}}  tokens/s  vs HF greedy  output = HF greedy  near-tie tokens (complete check)")
        for method in names:
            rate = tokens[name, method] / seconds[name, method]
            print(f"  {method:<{width}}  {rate:8.2f}  {rate / greedy:10.2f}x  {identical[name, method]:>8}/{len(prompts):<8}"
                  f"  {ties[name, method]}/{checked[name, method]}")


if __name__ == "__main__":
    main()
