"""Do the model directories taps-train writes read the same under transformers 4.x as under 5.x?

Serving engines and many users pin transformers 4 (4.57: RoPE base from `rope_theta`, no
`TokenizersBackend` class). This script tokenizes one chat with each version's AutoTokenizer and runs
AutoModelForCausalLM on the ids, in this Python (5.x) and in a Python that has 4.x, and prints per
directory: the 4.x version, whether the ids are equal, the RoPE base each read, and the max |logit|
difference.

    python3 -m venv /tmp/hf4 && /tmp/hf4/bin/pip install torch==2.13.0 'transformers==4.57.*' safetensors
    python bench/transformers4_compat.py --python4 /tmp/hf4/bin/python DIR [DIR ...]
    (DIR: e.g. `taps-train verifier info --verifier smollm2-135m` prints it; the tiny verifier; a stand-in)
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

# Runs under either version: prints ids, logits file and the RoPE base the config was read with.
PROBE = r"""
import json, sys, torch, transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
directory, out = sys.argv[1], sys.argv[2]
tokenizer = AutoTokenizer.from_pretrained(directory)
messages = [{"role": "user", "content": "Natalia sold clips to 48 of her friends in April. How many in May?"},
            {"role": "assistant", "content": "She sold half as many in May: 48 / 2 = 24 clips."}]
text = tokenizer.apply_chat_template(messages, tokenize=False)
ids = tokenizer(text, add_special_tokens=False)["input_ids"]
config = AutoConfig.from_pretrained(directory)
rope = getattr(config, "rope_theta", None) or (getattr(config, "rope_parameters", None) or {}).get("rope_theta")
model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32) if int(transformers.__version__.split(".")[0]) >= 5 \
    else AutoModelForCausalLM.from_pretrained(directory, torch_dtype=torch.float32)
with torch.no_grad():
    logits = model(torch.tensor([ids])).logits[0]
torch.save(logits, out)
print(json.dumps({"version": transformers.__version__, "ids": ids, "rope_theta": rope, "tokenizer": type(tokenizer).__name__}))
"""


def probe(python: str, directory: str, out: Path) -> dict:
    done = subprocess.run([python, "-c", PROBE, directory, str(out)], capture_output=True, text=True)
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directories", nargs="+")
    parser.add_argument("--python4", required=True, help="a Python with transformers 4.x installed")
    options = parser.parse_args()
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        for directory in options.directories:
            new, old = probe(sys.executable, directory, Path(tmp) / "5.pt"), probe(options.python4, directory, Path(tmp) / "4.pt")
            if "error" in new or "error" in old:
                print(f"{directory}: 5.x {new.get('error', 'ok')} | 4.x {old.get('error', 'ok')}")
                continue
            same_ids = new["ids"] == old["ids"]
            diff = (torch.load(Path(tmp) / "5.pt") - torch.load(Path(tmp) / "4.pt")).abs().max().item() if same_ids else float("nan")
            print(f"{directory}: transformers {new['version']} vs {old['version']}: ids equal {same_ids} ({len(new['ids'])} tokens), "
                  f"rope_theta {new['rope_theta']} vs {old['rope_theta']}, tokenizer {new['tokenizer']} vs {old['tokenizer']}, "
                  f"max |logit diff| {diff:.2e}")


if __name__ == "__main__":
    main()
