"""The loading layer stands alone: using trained maps never imports training code.

A fresh interpreter imports the transformers integration, applies LoLA with the shipped
linearized SmolLM2 maps (and their LoRA) to a random model of SmolLM2's attention shape, runs a
forward, and lists the ``lola.linearize`` modules it loaded: there must be none. The same check
for ``lola.models`` and the feature-map reader; and ``lola.linearize`` still re-exports the
loading names it always had.
"""

from __future__ import annotations

import json
import subprocess
import sys

import lola.linearize
import lola.pretrained

PROBE = r"""
import json, sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM
import lola
from lola.integrations.transformers import LoLACache, apply_lola
from lola.pretrained import read_feature_maps

maps = read_feature_maps("smollm2-135m-instruct")
g = maps.geometry
torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(
    vocab_size=64, hidden_size=g["num_heads"] * g["head_dim"], intermediate_size=32,
    num_hidden_layers=g["num_layers"], num_attention_heads=g["num_heads"],
    num_key_value_heads=g["num_kv_heads"], head_dim=g["head_dim"],
)).eval()
apply_lola(model, lola.LoLAConfig(window=8, sparse_size=4, sinks=2), feature_maps="smollm2-135m-instruct")
with torch.no_grad():
    logits = model(torch.arange(24).view(1, 24) % 64, cache=LoLACache(model)).logits
print(json.dumps({
    "linearize": sorted(m for m in sys.modules if m == "lola.linearize" or m.startswith("lola.linearize.")),
    "finite": bool(torch.isfinite(logits).all()),
    "mixing": model._lola.config.mixing,
    "lora_merged": bool(model._lola.merged_weights),
}))
"""


def _probe(code: str) -> dict:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_apply_lola_with_shipped_maps_loads_no_training_code():
    seen = _probe(PROBE)
    assert seen["linearize"] == [], f"inference imported training modules: {seen['linearize']}"
    assert seen["finite"]
    assert seen["mixing"] == "lola_authors"  # the trained maps were merged into the config (the default rule for LoLA on them)
    assert seen["lora_merged"]


def test_models_and_the_reader_load_no_training_code():
    code = (
        "import json, sys\nimport lola.models, lola.pretrained, lola.integrations.transformers, lola.eval.runner\n"
        "import lola.integrations.lm_eval.model\n"
        "print(json.dumps({'linearize': sorted(m for m in sys.modules if m.startswith('lola.linearize'))}))"
    )
    assert _probe(code)["linearize"] == []


def test_linearize_reexports_the_loading_names():
    for name in ("FeatureMaps", "read_feature_maps", "write_feature_maps", "LoraSpec", "merge_lora", "restore_weights"):
        assert getattr(lola.linearize, name) is getattr(lola.pretrained, name)
