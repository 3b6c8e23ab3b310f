"""Verifier compute dtype on this CPU: bfloat16 time / float32 time for the work a fit asks of the verifier, measured
in one run on the same inputs.

  1. reply regeneration: batched greedy generation (8 prompts x 32 new tokens), as `regenerate:` recipes run it
  2. feature-cache build: one forward pass over 4 x 256 tokens, hidden states out
  3. a training step's LM head: 2,048 drafted features through the verifier's head (49k vocabulary on SmolLM2)

bfloat16 is fast only where the CPU multiplies it natively (AMX or AVX512-BF16: recent Xeons); elsewhere PyTorch
converts it, and a ratio far above 1 says: keep the verifier in float32 (`verifier_dtype: auto` on a CPU).

    python bench/dtype.py [--verifier smollm2-135m] [--rounds 2]
"""

import argparse
import time

import torch

from taps_train.machine import cpu_flags
from taps_train.verifier.loading import load_verifier

NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # bfloat16 matrix multiplies in hardware


def fastest(work, rounds: int) -> float:
    """Seconds of the fastest of `rounds` runs (after one warm-up): load from other jobs only ever slows a run down."""
    work()
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        work()
        times.append(time.perf_counter() - began)
    return min(times)


def timings(verifier: str, dtype: str, rounds: int) -> dict[str, float]:
    loaded = load_verifier(verifier, "cpu", dtype)
    model, tokenizer = loaded.model, loaded.tokenizer
    prompts = [f"Question {i}: a farmer has {i + 3} cows and buys {2 * i + 1} more. How many cows does he have?" for i in range(8)]
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    tokens = torch.randint(0, model.config.vocab_size, (4, 256), generator=torch.Generator().manual_seed(0))
    features = torch.randn(2048, model.config.hidden_size, generator=torch.Generator().manual_seed(0)).to(model.dtype)
    head = model.get_output_embeddings()
    with torch.inference_mode():
        return {
            "regeneration (8 x 32 new tokens)": fastest(lambda: model.generate(**encoded, max_new_tokens=32, min_new_tokens=32, do_sample=False,
                                                                                pad_token_id=pad), rounds),
            "cache build forward (4 x 256 tokens)": fastest(lambda: model(tokens, output_hidden_states=True), rounds),
            "LM head of a training step (2,048 features)": fastest(lambda: head(features), rounds),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verifier", default="smollm2-135m")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    flags = [flag for flag in cpu_flags() if flag in NATIVE_BF16_FLAGS]
    print(f"verifier {args.verifier}, {torch.get_num_threads()} threads, native bfloat16: {', '.join(flags) or 'none'}")
    fp32 = timings(args.verifier, "float32", args.rounds)
    bf16 = timings(args.verifier, "bfloat16", args.rounds)
    print("| work | float32 s | bfloat16 s | bfloat16 / float32 |")
    print("| --- | --- | --- | --- |")
    for name in fp32:
        print(f"| {name} | {fp32[name]:.3f} | {bf16[name]:.3f} | {bf16[name] / fp32[name]:.2f} |")


if __name__ == "__main__":
    main()
