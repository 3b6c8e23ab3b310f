"""What a proposal vocabulary buys an EAGLE-1/2 drafter that is already trained: copies of its checkpoint that propose
only the N most frequent assistant tokens of a recipe (the tokens `fit` with `model.proposal_vocab_size: N` would
pick), to time against the original in one `bench/speedup.py` run (same prompts, order rotating, every output checked
against HF greedy). The weights are the checkpoint's; only drafting's LM-head rows change.

    python bench/proposal_vocabulary.py --checkpoint checkpoints/smol_eagle2_math/best-step=400.ckpt \
        --recipe data_recipes/smol_math.yaml --verifier smollm2-135m --sizes 2048 6144 --out /tmp/proposal
    python bench/speedup.py --verifier-dtype float32 --drafters <the checkpoint> /tmp/proposal/*.ckpt
"""

import argparse
import sys
from pathlib import Path

import torch

from taps_train import files
from taps_train.data.datamodule import DrafterDataModule
from taps_train.drafter.checkpoint import read_checkpoint
from taps_train.drafter.config import most_frequent_tokens, vocab_tokens
from taps_train.errors import TapsError


def with_proposal_vocabulary(checkpoint: dict, counts: torch.Tensor, size: int) -> dict:
    """The checkpoint's drafter proposing the `size` most frequent tokens of `counts` (ties: lower id first)."""
    config = dict(checkpoint["taps"]["drafter_config"])
    if "draft_vocab_size" in config:
        raise TapsError("an EAGLE-3 drafter has a draft vocabulary of its own; this adds one to EAGLE-1/2 and HASS drafters")
    config["proposal_vocab_size"] = vocab_tokens(size, config["vocab_size"], "--sizes")
    ids = most_frequent_tokens(counts[: config["vocab_size"]], config["proposal_vocab_size"])
    return {**checkpoint, "state_dict": {**checkpoint["state_dict"], "drafter.proposal_ids": ids},
            "taps": {**checkpoint["taps"], "drafter_config": config}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="an EAGLE-1/2 or HASS checkpoint")
    parser.add_argument("--recipe", required=True, help="the recipe whose assistant tokens are counted (its feature cache is built if missing)")
    parser.add_argument("--verifier", required=True)
    parser.add_argument("--sizes", type=int, nargs="+", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    try:
        checkpoint = read_checkpoint(args.checkpoint)
        data = DrafterDataModule(args.recipe, verifier=args.verifier)
        data.prepare_data()
        data.setup("fit")
        counts = data.loss_token_counts(checkpoint["taps"]["drafter_config"]["vocab_size"])
        Path(args.out).mkdir(parents=True, exist_ok=True)
        for size in args.sizes:
            path = Path(args.out) / f"{Path(args.checkpoint).stem}_proposal{size}.ckpt"
            files.save_torch(path, with_proposal_vocabulary(checkpoint, counts, size))
            covered = int(counts.sort(descending=True).values[:size].sum()) / max(1, int(counts.sum()))
            print(f"{path}: {size} tokens, {covered:.2%} of the recipe's assistant tokens")
    except TapsError as err:
        sys.exit(f"error: {err}")


if __name__ == "__main__":
    main()
