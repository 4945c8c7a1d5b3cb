#!/usr/bin/env bash
# Linearize SmolLM2-135M-Instruct on one GPU: both stages of `lola linearize`, the folder left in $OUT.
#
#   bash benchmarks/gpu_linearize.sh            (on the GPU machine, repository root)
#
# Inputs: the folder written by `python benchmarks/gpu_stage.py` (.gpu/a and .gpu/b, sent in two
# calls: the machine is offline and takes 64 MiB per call). Needs a CUDA build of torch with
# transformers and peft (the machine's image has them); gguf comes from the staged wheel.
# Plan ~10 minutes on an H200. Environment overrides: STAGE (default .gpu), OUT (default
# gpu_run), STEPS1, STEPS2, BATCH (sequences per step, both stages), DEVICE (default cuda; `cpu` with tiny STEPS checks
# the script itself on any machine).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
STAGE="${STAGE:-.gpu}"
OUT="${OUT:-gpu_run}"
PY="${PYTHON:-python3}"
WORK="$(mktemp -d)"
mkdir -p "$OUT"

# the model: two halves, checked against the sha256 computed where it was split
cat "$STAGE/a/model.gguf.part" "$STAGE/b/model.gguf.part" >"$WORK/SmolLM2-135M-Instruct.Q4_1.gguf"
(cd "$WORK" && sha256sum -c "$ROOT/$STAGE/b/model.sha256")

# packages the image lacks, from staged wheels only (no network)
"$PY" -m pip install -q --no-index --no-deps --target "$WORK/pydeps" "$STAGE"/b/wheels/*.whl
export PYTHONPATH="$ROOT/src:$WORK/pydeps${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$WORK/text" && gunzip -c "$STAGE/b/train.txt.gz" >"$WORK/text/train.txt"

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "gpu: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1 || echo none)"
  "$PY" -c "import torch, transformers, peft; print(f'torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}')"
} | tee "$OUT/machine.txt"

# --text is the training split only; its own last 10% serves as the run's held-out check.
time "$PY" -m lola.cli linearize \
  --model "$WORK/SmolLM2-135M-Instruct.Q4_1.gguf" --text "$WORK/text/train.txt" --out "$OUT/run" \
  --device "${DEVICE:-cuda}" --steps "${STEPS1:-400}" --batch "${BATCH:-4}" --train-chunks 64 \
  --stage2-steps "${STEPS2:-600}" --checkpoint-every 50 2>&1 | tr '\r' '\n' | grep -v "it/s\]$" | tee "$OUT/linearize.log"

# what comes back: at most 8 files, no deeper than $OUT/a/b
rm -f "$OUT/run/checkpoint.pt" "$OUT/run/checkpoint-stage2.pt"
ls -la "$OUT/run"
