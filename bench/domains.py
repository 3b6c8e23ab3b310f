"""Is the tiny verifier a meaningful verifier for each offline domain? Its next-token loss (nats/token) on
chat-formatted held-out conversations of each domain recipe, and on the conversations it held out of its own
pretraining, split by topic. Lower is better; a domain whose loss is close to the pretraining domains' is one
the verifier has learned (a drafter then has a real distribution to imitate).

    python bench/domains.py [--recipes data_recipes/tiny_math.yaml ...] [--conversations 200]
"""

import argparse

import torch

from taps_train.data.recipe import load_recipe, select
from taps_train.data.sources import has_code
from taps_train.verifier.loading import load_verifier
from taps_train.verifier.offline.pretrain import mean_loss
from taps_train.verifier.offline.tiny import TinyVerifierSpec, _blocks, _sharegpt_split

RECIPES = ["data_recipes/tiny_math.yaml", "data_recipes/tiny_prose.yaml", "data_recipes/tiny_code.yaml", "data_recipes/tiny_chat.yaml"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", default=RECIPES)
    parser.add_argument("--conversations", type=int, default=200, help="held-out conversations per recipe")
    options = parser.parse_args()
    spec = TinyVerifierSpec()
    loaded = load_verifier("taps-tiny", device="cpu", dtype="float32")
    model, tokenizer = loaded.model, loaded.tokenizer
    torch.set_grad_enabled(False)
    print(f"{'held-out set':<44} {'conversations':>13} {'rows':>5} {'loss':>6}")
    for path in options.recipes:
        recipe = load_recipe(path)
        heldout = [c for source in recipe.sources for c in select(source, recipe.seed).heldout][: options.conversations]
        report(f"{recipe.name} (recipe held-out)", heldout, model, tokenizer, spec)
    _, verifier_heldout, _, _ = _sharegpt_split(spec)
    report("verifier's own held-out ShareGPT, code", [c for c in verifier_heldout if has_code(c)], model, tokenizer, spec)
    report("verifier's own held-out ShareGPT, prose", [c for c in verifier_heldout if not has_code(c)], model, tokenizer, spec)


def report(label: str, conversations: list, model, tokenizer, spec: TinyVerifierSpec) -> None:
    blocks = _blocks(tokenizer, conversations, spec)
    print(f"{label:<44} {len(conversations):>13} {len(blocks):>5} {mean_loss(model, blocks):>6.3f}")


if __name__ == "__main__":
    main()
