#!/usr/bin/env bash
# GPU check of lola, in one go: the Triton kernel tests on CUDA, the kernel benchmark, the layer benchmark.
#
#   bash benchmarks/gpu_check.sh [REPORT.md]   (default: $OUT/gpu_check.md when OUT is set, else gpu_check.md)
#
# Sections, each under its own timeout inside one overall budget (TOTAL_BUDGET_S, default 470 s,
# i.e. under 8 minutes on an H100/H200 whatever happens; each section keeps back the minimum time
# of the sections after it, so a slow one cannot starve the rest):
#   1. LOLA_KERNELS=triton LOLA_AUTOTUNE=0 pytest tests/kernels (one config per kernel: compile
#      time; with pytest-xdist, on TEST_WORKERS processes, default 4)
#   2. python benchmarks/kernel_timings.py --quick (autotuned): Triton vs reference vs fla's chunk_linear_attn
#   3. python benchmarks/layer.py --device cuda --quick: the whole layer's decode step (GB/s, %
#      of peak HBM bandwidth at batch 64) and 16K prefill vs SDPA and fla, SmolLM2 then Llama-8B shapes
# A section that fails or times out is reported loudly and the next one still runs; the exit
# code is non-zero if any failed. Partial output of a section cut by its timeout is kept.
#
# Outputs: the Markdown report, plus (in $OUT when set, else a temporary folder) the logs
# pip.log, tests.log, bench.log, bench.md, layer.log, layer.md: 7 files.
#
# Needs a CUDA build of torch (triton comes with it). Packages the machine lacks (pydantic for
# lola; flash-linear-attention for the fla baseline) come from wheels in $WHEELS (default .whl/,
# git-ignored; install with --no-deps, so include pydantic-core, annotated-types,
# typing-inspection), else from pip if the machine is online (fails fast when it is not).
# Overrides: PYTHON, TOTAL_BUDGET_S, TESTS_TIMEOUT_S (330), BENCH_TIMEOUT_S (240),
# LAYER_TIMEOUT_S (240), TEST_WORKERS, LAYER_ARGS (replaces the layer benchmark's arguments).
set -uo pipefail

START=$(date +%s)
DEADLINE=$((START + ${TOTAL_BUDGET_S:-470}))
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET # compiled kernels on CUDA, never the interpreter
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  LOG_DIR="$OUT"
  REPORT="${1:-$OUT/gpu_check.md}"
else
  LOG_DIR="$(mktemp -d)"
  REPORT="${1:-gpu_check.md}"
fi
rm -f "$LOG_DIR"/{pip.log,tests.log,bench.log,bench.md,layer.log,layer.md}
FAILED=()

# Seconds a section may run: at most CAP, and no later than the deadline minus RESERVE (the
# minimum kept for the sections after it); never under 30.
budget() {
  local cap=$1 reserve=$2 left
  left=$((DEADLINE - $(date +%s) - reserve))
  [ "$left" -lt "$cap" ] && cap=$left
  [ "$cap" -lt 30 ] && cap=30
  echo "$cap"
}

fail() { # SECTION RC: say it loudly, remember it, go on
  echo
  echo "!!!!!!!! $1 FAILED (exit code $2$([ "$2" -eq 124 ] && echo ', timed out')) -- continuing with the next section"
  echo
  FAILED+=("$1 (exit code $2)")
}

"$PY" - <<'PYEOF' || { echo "no CUDA device visible to torch: nothing to check"; exit 1; }
import torch
assert torch.cuda.is_available()
PYEOF

# Packages: staged wheels first (GPU boxes are often offline), pip only for what is still missing.
WHEELS="${WHEELS:-$ROOT/.whl}"
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  SITE="$(mktemp -d)"
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$WHEELS"/*.whl >>"$LOG_DIR/pip.log" 2>&1; then
    export PYTHONPATH="$ROOT/src:$SITE${PYTHONPATH#"$ROOT/src"}"
  else
    echo "!! installing the wheels of $WHEELS failed (see $LOG_DIR/pip.log)"
  fi
fi
PIP_FAST=(--retries 0 --timeout 10)
"$PY" -c "import pytest, hypothesis, pydantic" 2>/dev/null \
  || timeout 90 "$PY" -m pip install -q "${PIP_FAST[@]}" pytest hypothesis pydantic >>"$LOG_DIR/pip.log" 2>&1 \
  || echo "!! pip install pytest hypothesis pydantic failed (see $LOG_DIR/pip.log)"
"$PY" -c "import fla" 2>/dev/null || timeout 90 "$PY" -m pip install -q "${PIP_FAST[@]}" flash-linear-attention >>"$LOG_DIR/pip.log" 2>&1 || true
"$PY" -c "import lola.kernels" 2>>"$LOG_DIR/pip.log" || echo "!!!!!!!! lola does not import (pydantic missing? see $LOG_DIR/pip.log): every section will fail"

{
  echo "# lola GPU check"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- src benchmarks 2>/dev/null || echo ' (+ local changes)')"
  echo "- gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
  "$PY" -c "import torch, triton; print(f'- torch {torch.__version__} (CUDA {torch.version.cuda}), triton {triton.__version__}')"
  "$PY" -c "import fla; print(f'- fla {getattr(fla, \"__version__\", \"?\")}')" 2>/dev/null || echo "- fla: not installed"
  echo
} >"$REPORT"

# ---------------------------------------------------------------------------- 1. kernel tests
echo "== kernel tests on CUDA (LOLA_KERNELS=triton)"
XDIST=()
"$PY" -c "import xdist" 2>/dev/null && XDIST=(-n "${TEST_WORKERS:-4}")
limit=$(budget "${TESTS_TIMEOUT_S:-330}" $((120 + 150)))
start=$(date +%s)
LOLA_KERNELS=triton LOLA_AUTOTUNE=0 timeout -k 10 "$limit" "$PY" -m pytest tests/kernels -q -p no:cacheprovider -rfs "${XDIST[@]}" \
  2>&1 | tee "$LOG_DIR/tests.log"
tests_rc=${PIPESTATUS[0]}
tests_s=$(($(date +%s) - start))
[ "$tests_rc" -eq 0 ] || fail "kernel tests" "$tests_rc"
{
  echo "## Tests"
  echo
  echo "\`LOLA_KERNELS=triton LOLA_AUTOTUNE=0 pytest tests/kernels ${XDIST[*]}\`: exit code $tests_rc$([ "$tests_rc" -eq 124 ] && echo " (timed out at ${limit}s)"), ${tests_s}s"
  echo
  echo '```'
  grep -E "passed|failed|error|FAILED|ERROR" "$LOG_DIR/tests.log" | tail -40
  echo '```'
  echo
} >>"$REPORT"

# ---------------------------------------------------------------------------- 2. kernel benchmark
echo "== kernel benchmark"
limit=$(budget "${BENCH_TIMEOUT_S:-240}" 150)
start=$(date +%s)
timeout -k 10 "$limit" "$PY" benchmarks/kernel_timings.py --quick --output "$LOG_DIR/bench.md" 2>&1 | tee "$LOG_DIR/bench.log"
bench_rc=${PIPESTATUS[0]}
bench_s=$(($(date +%s) - start))
[ "$bench_rc" -eq 0 ] || fail "kernel benchmark" "$bench_rc"
{
  echo "## Kernel benchmark (exit code $bench_rc$([ "$bench_rc" -eq 124 ] && echo ", timed out at ${limit}s: partial"), ${bench_s}s)"
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
  echo
} >>"$REPORT"

# ---------------------------------------------------------------------------- 3. layer benchmark
echo "== layer benchmark"
if [ -n "${LAYER_ARGS:-}" ]; then
  read -r -a layer_args <<<"$LAYER_ARGS"
else
  layer_args=(--quick --shape smollm2 llama8b --mixing softmax_only lola_authors --check-inputs both)
fi
limit=$(budget "${LAYER_TIMEOUT_S:-240}" 0)
start=$(date +%s)
timeout -k 10 "$limit" "$PY" benchmarks/layer.py --device cuda "${layer_args[@]}" --output "$LOG_DIR/layer.md" 2>&1 | tee "$LOG_DIR/layer.log"
layer_rc=${PIPESTATUS[0]}
layer_s=$(($(date +%s) - start))
[ "$layer_rc" -eq 0 ] || fail "layer benchmark" "$layer_rc"
{
  echo "## Layer benchmark (exit code $layer_rc$([ "$layer_rc" -eq 124 ] && echo ", timed out at ${limit}s: partial"), ${layer_s}s)"
  echo
  echo "\`python benchmarks/layer.py --device cuda ${layer_args[*]}\`"
  echo
  if [ -s "$LOG_DIR/layer.md" ]; then
    sed 's/^## .*//' "$LOG_DIR/layer.md"
  elif grep -q '^## LoLA layer benchmark' "$LOG_DIR/layer.log"; then # cut short: what it printed (Markdown)
    sed -n '/^## LoLA layer benchmark/,$p' "$LOG_DIR/layer.log" | sed 's/^## .*//'
  else
    echo '```'
    tail -40 "$LOG_DIR/layer.log"
    echo '```'
  fi
  echo
  echo "Targets: the layer's decode step >= 50% of peak HBM bandwidth at batch 64; prefill tokens/s vs SDPA and fla at 16K tokens."
  echo
} >>"$REPORT"

total_s=$(($(date +%s) - START))
{
  echo "## Summary"
  echo
  echo "total ${total_s}s (budget ${TOTAL_BUDGET_S:-470}s); tests ${tests_s}s, kernel benchmark ${bench_s}s, layer benchmark ${layer_s}s"
  if [ ${#FAILED[@]} -eq 0 ]; then echo "all sections passed"; else printf -- '- FAILED: %s\n' "${FAILED[@]}"; fi
} >>"$REPORT"
echo "report written to $REPORT (logs in $LOG_DIR); total ${total_s}s"
if [ ${#FAILED[@]} -ne 0 ]; then
  printf '!!!!!!!! FAILED: %s\n' "${FAILED[@]}"
  exit 1
fi
