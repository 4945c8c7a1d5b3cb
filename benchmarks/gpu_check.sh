#!/usr/bin/env bash
# GPU check of the lola kernels: Triton kernel tests on CUDA + the kernel benchmark.
#
#   bash benchmarks/gpu_check.sh [REPORT.md]      (default: gpu_check.md)
#
# Needs a CUDA build of torch (triton comes with it). Installs pytest/hypothesis/pydantic
# when missing and, if reachable, flash-linear-attention for the fla baseline. Finishes in < 8 minutes on
# an H100/H200: tests run with LOLA_AUTOTUNE=0 (one config per kernel, compile time),
# the benchmark autotunes.
set -uo pipefail

REPORT="${1:-gpu_check.md}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python}"
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET  # compiled kernels on CUDA, never the interpreter
LOG_DIR="$(mktemp -d)"

"$PY" - <<'PYEOF' || { echo "no CUDA device visible to torch: nothing to check"; exit 1; }
import torch
assert torch.cuda.is_available()
PYEOF

# Only reach for pip when something is missing (GPU boxes are often offline).
"$PY" -c "import pytest, hypothesis, pydantic" 2>/dev/null \
  || "$PY" -m pip install -q pytest hypothesis pydantic >"$LOG_DIR/pip.log" 2>&1 \
  || echo "pip install pytest hypothesis pydantic failed (see $LOG_DIR/pip.log)"
"$PY" -c "import fla" 2>/dev/null || timeout 120 "$PY" -m pip install -q flash-linear-attention >>"$LOG_DIR/pip.log" 2>&1 || true

{
  echo "# lola kernels GPU check"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "- gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
  "$PY" -c "import torch, triton; print(f'- torch {torch.__version__} (CUDA {torch.version.cuda}), triton {triton.__version__}')"
  "$PY" -c "import fla; print(f'- fla {getattr(fla, \"__version__\", \"?\")}')" 2>/dev/null || echo "- fla: not installed"
  echo
} >"$REPORT"

echo "== kernel tests on CUDA (LOLA_KERNELS=triton)"
start=$(date +%s)
LOLA_KERNELS=triton LOLA_AUTOTUNE=0 timeout "${TESTS_TIMEOUT_S:-330}" "$PY" -m pytest tests/kernels -q -p no:cacheprovider -rfs \
  2>&1 | tee "$LOG_DIR/tests.log"
tests_rc=${PIPESTATUS[0]}
tests_s=$(( $(date +%s) - start ))
{
  echo "## Tests"
  echo
  echo "\`LOLA_KERNELS=triton LOLA_AUTOTUNE=0 pytest tests/kernels\`: exit code $tests_rc, ${tests_s}s"
  echo
  echo '```'
  grep -E "passed|failed|error|FAILED|ERROR" "$LOG_DIR/tests.log" | tail -40
  echo '```'
  echo
} >>"$REPORT"

echo "== benchmark"
start=$(date +%s)
timeout "${BENCH_TIMEOUT_S:-240}" "$PY" benchmarks/kernels.py --quick --output "$LOG_DIR/bench.md" 2>&1 | tee "$LOG_DIR/bench.log"
bench_rc=${PIPESTATUS[0]}
bench_s=$(( $(date +%s) - start ))
{
  echo "## Benchmark (exit code $bench_rc, ${bench_s}s)"
  echo
  if [ -s "$LOG_DIR/bench.md" ]; then
    sed 's/^## .*//' "$LOG_DIR/bench.md"
  else
    echo '```'
    tail -40 "$LOG_DIR/bench.log"
    echo '```'
  fi
  echo
  echo "Targets: chunk_linear_attention >= 0.8x fla at T=16K (bf16); decode_step >= 50% of peak bandwidth at B=64, N=512."
} >>"$REPORT"

echo "report written to $REPORT"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
