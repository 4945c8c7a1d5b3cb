#!/usr/bin/env bash
# lola-attention-vllm on a GPU against stock vLLM, in one go: speed at 1K/4K/8K and the capacity under one
# cache size, on a random-weight model of a real model's shape (no model download: greedy
# decoding with ignore_eos does the same work whatever the weights are).
#
#   bash benchmarks/gpu_vllm.sh            (the report goes to $OUT/gpu_vllm.md when OUT is set)
#
# Needs vLLM's CUDA build importable by $PYTHON (default python): the GPU machine cannot fetch it,
# so it must be installed there already (or its wheels be in $WHEELS, installed with --no-deps).
# lola and lola-attention-vllm are installed from this checkout with --no-deps.
# Overrides: PYTHON, SHAPE (smollm2; llama1b, llama8b: see benchmarks/random_llama.py), DTYPE
# (bfloat16), KV_SPACE (GiB of cache for both methods, default 4), CAPACITY (concurrent requests,
# default 64), BATCH (8), DECODE (64), TIMEOUT_S (540).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python}"
OUTDIR="${OUT:-$(mktemp -d)}"
mkdir -p "$OUTDIR"
REPORT="$OUTDIR/gpu_vllm.md"
if [ -n "${WHEELS:-}" ] && ls "$WHEELS"/*.whl > /dev/null 2>&1; then
  "$PY" -m pip install -q --no-deps "$WHEELS"/*.whl > "$OUTDIR/pip.log" 2>&1
fi
if ! "$PY" -c "import vllm, torch; assert torch.cuda.is_available()" > "$OUTDIR/vllm_import.log" 2>&1; then
  echo "vLLM's CUDA build does not import here (or no GPU): see $OUTDIR/vllm_import.log; nothing was measured" | tee "$REPORT"
  exit 1
fi
"$PY" -m pip install -q --no-deps -e . -e integrations/vllm >> "$OUTDIR/pip.log" 2>&1 || { echo "installing lola failed: $OUTDIR/pip.log" | tee "$REPORT"; exit 1; }
MODEL="$(mktemp -d)/model"
"$PY" benchmarks/random_llama.py "$MODEL" --shape "${SHAPE:-smollm2}" --dtype "${DTYPE:-bfloat16}" || exit 1
{
  echo "# lola-attention-vllm on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  echo
  echo "random ${SHAPE:-smollm2}-shaped model, ${DTYPE:-bfloat16}; command:"
  echo
  echo "    python benchmarks/vllm_serve.py --model MODEL --contexts 1024 4096 8000 --batch ${BATCH:-8} --decode ${DECODE:-64} --dtype ${DTYPE:-bfloat16} --capacity ${CAPACITY:-64} --capacity-contexts 4096 8000 --kv-space ${KV_SPACE:-4}"
  echo
} > "$REPORT"
HF_HUB_OFFLINE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 timeout "${TIMEOUT_S:-540}" "$PY" benchmarks/vllm_serve.py --model "$MODEL" \
  --contexts 1024 4096 8000 --batch "${BATCH:-8}" --decode "${DECODE:-64}" --dtype "${DTYPE:-bfloat16}" \
  --capacity "${CAPACITY:-64}" --capacity-contexts 4096 8000 --kv-space "${KV_SPACE:-4}" --results "$OUTDIR/gpu_vllm.json" \
  > "$OUTDIR/gpu_vllm.log" 2>&1
rc=$?
grep -v "INFO\|WARNING" "$OUTDIR/gpu_vllm.log" | grep "^|\|^at \|^batch\|^capacity\|^  " >> "$REPORT"
[ $rc -ne 0 ] && echo "vllm_serve.py failed (exit code $rc$([ $rc -eq 124 ] && echo ', timed out')): see gpu_vllm.log" | tee -a "$REPORT"
cat "$REPORT"
exit $rc
