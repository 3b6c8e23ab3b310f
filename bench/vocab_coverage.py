"""How much of a recipe's held-out assistant text a draft vocabulary of N tokens can propose at all.

An EAGLE-3 drafter (`draft_vocab_size`) and an EAGLE-1/2 proposal vocabulary (`proposal_vocab_size`) draft only the N
most frequent assistant tokens of their training data; a verifier token outside them is never accepted, so the
held-out share they cover bounds the acceptance of every drafted token. Counted on the recipe's training samples,
measured on its held-out ones (for smol_* recipes, the conversations the chat_heldout / math_heldout benchmarks prompt
with, their replies regenerated as the training replies are). Tokens only: no feature cache is built (a recipe's
regenerated replies are, where missing).

    python bench/vocab_coverage.py --recipe data_recipes/smol_chat_regen_3k.yaml --verifier smollm2-135m \
        --sizes 2048 6144 12288 24576
"""

import argparse
import sys

import torch

from taps_train.data.datamodule import DrafterDataModule, assistant_token_counts
from taps_train.drafter.config import most_frequent_tokens
from taps_train.errors import TapsError
from taps_train.verifier.loading import read_verifier_files


def coverage(train_counts: torch.Tensor, heldout_counts: torch.Tensor, size: int) -> float:
    """The share of held-out occurrences whose token is among the `size` most frequent training tokens."""
    return float(heldout_counts[most_frequent_tokens(train_counts, size)].sum() / heldout_counts.sum().clamp(min=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", required=True)
    parser.add_argument("--verifier", required=True)
    parser.add_argument("--sizes", type=int, nargs="+", required=True)
    args = parser.parse_args()
    try:
        vocab_size = read_verifier_files(args.verifier).config.get_text_config(decoder=True).vocab_size
        data = DrafterDataModule(args.recipe, verifier=args.verifier, online=True)
        data.prepare_data()
        data.setup("fit")
        if data.val_set is None:
            raise TapsError(f"recipe {args.recipe} holds out no samples (heldout: 0 in every source), so there is nothing to measure coverage on")
        train_counts = data.loss_token_counts(vocab_size)
        heldout_counts = assistant_token_counts(data.val_set, vocab_size)
        print(f"{args.recipe}: {int(train_counts.sum()):,} training assistant tokens ({int((train_counts > 0).sum()):,} distinct), "
              f"{int(heldout_counts.sum()):,} held-out")
        for size in args.sizes:
            print(f"  {size:>6,} most frequent tokens: {coverage(train_counts, heldout_counts, size):.2%} of held-out assistant tokens")
    except TapsError as err:
        sys.exit(f"error: {err}")


if __name__ == "__main__":
    main()
