#!/usr/bin/env bash
# GPU smoke test of the real-verifier path (issue 10): stand-in (or given) verifier -> feature cache on
# the GPU in bf16 -> 30-step bf16-mixed fit (DDP on 1 GPU; DeepSpeed ZeRO-2 too when installed) -> T=0
# eval, checked token for token against the verifier's own HF greedy output -> export. Prints the wall
# time and peak GPU memory of every stage, then bench/speedup.py's tokens/s against HF greedy and prompt lookup. About 5-8 minutes on one modern GPU.
#
#   bench/gpu_smoke.sh [--verifier PATH] [--device cuda|cpu] [--work DIR] [--steps N] [--layers N] [--hidden H]
#
# --device cpu runs the same flow on the CPU (float32, no DeepSpeed) to check the script itself.
set -euo pipefail
cd "$(dirname "$0")/.."

VERIFIER="" DEVICE=cuda WORK=checkpoints/gpu_smoke STEPS=30 LAYERS=8 HIDDEN=1024
while [[ $# -gt 0 ]]; do
  case "$1" in
    --verifier) VERIFIER="$2"; shift 2 ;;
    --device) DEVICE="$2"; shift 2 ;;
    --work) WORK="$2"; shift 2 ;;
    --steps) STEPS="$2"; shift 2 ;;
    --layers) LAYERS="$2"; shift 2 ;;
    --hidden) HIDDEN="$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$WORK"
export TAPS_HOME="${TAPS_HOME:-$WORK/taps_home}" WANDB_MODE=offline
if [[ "$DEVICE" == cpu ]]; then ACCEL=cpu PRECISION=32-true DTYPE=float32; else ACCEL=gpu PRECISION=bf16-mixed DTYPE=bfloat16; fi
SUMMARY="$WORK/summary.txt"; : > "$SUMMARY"

# Runs one stage; records wall seconds and the peak GPU memory nvidia-smi saw while it ran.
stage() {
  local name="$1"; shift
  local sampler="" peak_file="$WORK/.peak_$name"
  : > "$peak_file"
  if [[ "$DEVICE" != cpu ]] && command -v nvidia-smi >/dev/null; then
    (while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | awk '{s += $1} END {print s}' >> "$peak_file"; sleep 0.2; done) &
    sampler=$!
  fi
  local began; began=$(date +%s.%N)
  echo "=== $name: $*"
  "$@"
  local seconds; seconds=$(awk -v a="$began" -v b="$(date +%s.%N)" 'BEGIN {print b - a}')
  [[ -n "$sampler" ]] && kill "$sampler" 2>/dev/null || true
  local peak; peak=$(sort -n "$peak_file" | tail -1)
  printf '%-22s %8.1f s   peak GPU memory %s MiB\n' "$name" "$seconds" "${peak:-n/a}" | tee -a "$SUMMARY"
}

if [[ -z "$VERIFIER" ]]; then
  VERIFIER="$WORK/standin"
  stage standin taps-train verifier standin "$VERIFIER" --layers "$LAYERS" --hidden "$HIDDEN"
fi

cat > "$WORK/recipe.yaml" <<EOF
name: gpu_smoke_math
seed: 0
max_length: 512
sources:
  - source: gsm_symbolic
    args: {size: 700, seed: 1}
    heldout: 20
    count: 640
EOF

stage cache taps-train cache --recipe "$WORK/recipe.yaml" --verifier "$VERIFIER" --device "$DEVICE" --verifier-dtype "$DTYPE" --cache-dir "$WORK/features"

fit_config() {  # $1 = strategy block, $2 = run dir, $3 = devices (default 1)
  cat <<EOF
seed_everything: 0
trainer:
  accelerator: $ACCEL
  devices: ${3:-1}
  $1
  precision: $PRECISION
  max_steps: $STEPS
  val_check_interval: $STEPS
  check_val_every_n_epoch: null
  limit_val_batches: 4
  log_every_n_steps: 5
  default_root_dir: $2
  logger: false
  callbacks:
    - class_path: taps_train.eval.callback.AcceptanceLengthCallback
      init_args: {benchmarks: [math_heldout], prompts_per_benchmark: 2, max_new_tokens: 32}
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {dirpath: $2, save_last: true}
model:
  class_path: taps_train.training.HassModule
  init_args: {verifier: $VERIFIER, lr: 1.0e-4, warmup_steps: 5}
data:
  class_path: taps_train.data.datamodule.DrafterDataModule
  init_args: {recipe: $WORK/recipe.yaml, cache_dir: $WORK/features, verifier_dtype: $DTYPE, batch_size: 8, max_tokens_per_batch: 4096, val_samples_per_source: 16}
EOF
}
fit_config "strategy: ddp" "$WORK/run_ddp" > "$WORK/fit_ddp.yaml"
stage fit_ddp taps-train fit --config "$WORK/fit_ddp.yaml"
CKPT="$WORK/run_ddp/last.ckpt"

if [[ "$DEVICE" != cpu ]] && python -c "import deepspeed" 2>/dev/null; then
  fit_config "strategy: {class_path: lightning.pytorch.strategies.DeepSpeedStrategy, init_args: {stage: 2}}" "$WORK/run_zero2" > "$WORK/fit_zero2.yaml"
  stage fit_zero2 taps-train fit --config "$WORK/fit_zero2.yaml" || echo "fit_zero2 FAILED (see above)" | tee -a "$SUMMARY"
else
  echo "fit_zero2              skipped (deepspeed not installed or --device cpu)" | tee -a "$SUMMARY"
fi

stage eval taps-train eval --drafters "$CKPT" --verifier "$VERIFIER" --device "$DEVICE" --verifier-dtype "$DTYPE" \
  --benchmarks math_heldout --prompts 4 --max-new-tokens 64 --output "$WORK/eval/report.json"

# Lossless check on this device: speculative decoding at T=0 vs the verifier's own HF greedy generate,
# in float32 (must be identical) and in the run's compute dtype (low precision may flip near-ties).
lossless() {
  python - "$VERIFIER" "$CKPT" "$DEVICE" <<'EOF'
import sys
import torch
from taps_train.drafter.checkpoint import load_drafter
from taps_train.eval.benchmarks import load_benchmark
from taps_train.eval.evaluate import chat_ids
from taps_train.decoding.decoder import SpeculativeDecoder
from taps_train.decoding.tree import TreeConfig
from taps_train.verifier.fingerprint import verifier_fingerprint
from taps_train.verifier.loading import load_verifier

verifier_path, checkpoint, device = sys.argv[1:]
prompts, _ = load_benchmark("math_heldout", 4)
for dtype in ["float32"] + (["bfloat16"] if device != "cpu" else []):
    loaded = load_verifier(verifier_path, device, dtype)
    drafter = load_drafter(checkpoint, loaded.model, verifier_fingerprint(loaded.path, loaded.tokenizer))
    decoder = SpeculativeDecoder(loaded.model, [drafter], TreeConfig())
    same = 0
    for prompt in prompts:
        ids = chat_ids(loaded.tokenizer, [{"role": "user", "content": prompt.turns[0]}])
        spec = decoder.generate(ids, max_new_tokens=64).tokens
        prompt_ids = torch.tensor([ids], device=loaded.model.device)
        with torch.no_grad():
            greedy = loaded.model.generate(prompt_ids, attention_mask=torch.ones_like(prompt_ids), max_new_tokens=len(spec),
                                           do_sample=False)[0, len(ids):].tolist()
        same += list(spec) == greedy[: len(spec)]
    print(f"lossless check {dtype} on {device}: {same}/{len(prompts)} prompts identical to HF greedy")
EOF
}
stage lossless lossless

# The decoder's round time against context length (a 1k-token prompt decoded for 1k tokens) on this device.
stage round_profile python bench/round_profile.py --verifier "$VERIFIER" --drafter "$CKPT" --device "$DEVICE" \
  --verifier-dtype "$DTYPE" --prompts 1 --long-context

# Wall-clock speedup on this device: HF greedy, HF prompt lookup and taps-train with --tree auto, one run.
stage speedup python bench/speedup.py --verifier "$VERIFIER" --drafters "$CKPT" --device "$DEVICE" --verifier-dtype "$DTYPE" \
  --benchmarks math_heldout --prompts 4 --max-new-tokens 64

stage export taps-train export "$CKPT" --out "$WORK/export" --verifier "$VERIFIER" --overwrite

# Two processes under DeepSpeed ZeRO-2: the checkpoint is a directory; consolidate it, then eval and export
# both the directory and the consolidated file.
GPUS=$(python -c "import torch; print(torch.cuda.device_count())")
if [[ "$DEVICE" != cpu ]] && (( GPUS >= 2 )) && python -c "import deepspeed" 2>/dev/null; then
  fit_config "strategy: {class_path: lightning.pytorch.strategies.DeepSpeedStrategy, init_args: {stage: 2}}" "$WORK/run_zero2x2" 2 > "$WORK/fit_zero2x2.yaml"
  stage fit_zero2x2 taps-train fit --config "$WORK/fit_zero2x2.yaml"
  stage consolidate taps-train consolidate "$WORK/run_zero2x2/last.ckpt"
  stage eval_zero2x2 taps-train eval --drafters "$WORK/run_zero2x2/last.ckpt" "$WORK/run_zero2x2/last.drafter.ckpt" --strategy route-confidence \
    --verifier "$VERIFIER" --device "$DEVICE" --verifier-dtype "$DTYPE" --benchmarks math_heldout --prompts 4 --max-new-tokens 64 \
    --output "$WORK/eval/zero2x2.json"
  stage export_zero2x2 taps-train export "$WORK/run_zero2x2/last.ckpt" --out "$WORK/export_zero2x2" --verifier "$VERIFIER" --overwrite
else
  echo "zero2x2                skipped (needs 2+ GPUs and deepspeed)" | tee -a "$SUMMARY"
fi

echo; echo "=== summary ($DEVICE, verifier $VERIFIER)"; cat "$SUMMARY"
