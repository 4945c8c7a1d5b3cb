"""`import lola` (memories, policies, schedules, kernels, the layer) needs neither transformers nor peft."""

import subprocess
import sys

import pytest

BLOCKER = """
import sys

class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("transformers", "peft", "safetensors", "tqdm"):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden in this test)", name=name)

sys.meta_path.insert(0, Hide())
"""

USE_CORE = """
import torch
import lola
from lola import kernels, memory, policies, schedules
cfg = lola.LoLAConfig(window=8, sparse_size=8, sinks=2, chunk=4)
attn = lola.compose(cfg, num_heads=4, head_dim=16, num_kv_heads=2)
q = torch.randn(1, 40, 4, 16)
k, v = torch.randn(1, 40, 2, 16), torch.randn(1, 40, 2, 16)
o, state = attn(q, k, v)
assert o.shape == (1, 40, 4, 16) and state.nbytes() > 0
print(sorted(m for m in sys.modules if m.split(".")[0] in ("transformers", "peft")))
"""


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKER + code], capture_output=True, text=True, timeout=120)


def test_the_core_imports_and_runs_without_transformers():
    done = _run(USE_CORE)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_transformers_api_says_what_is_missing():
    done = _run("import lola\nlola.apply_lola")
    assert done.returncode != 0 and "lola.apply_lola needs transformers, from the hf extra (pip install 'lola-attention[hf]')" in done.stderr


def test_the_command_line_names_the_extra_to_install(tmp_path):
    done = _run("from lola.cli import main\nmain(['--help'])")
    assert done.returncode == 0 and "niah" in done.stdout  # the parser itself needs no extra
    out = tmp_path / "run"
    done = _run(f"import sys\nfrom lola.cli import main\nsys.exit(main(['niah', '--model', 'tiny-random-llama', '--out', {str(out)!r}]))")
    assert done.returncode == 2, done.stderr
    assert "lola niah: error: needs transformers, from the hf extra: pip install 'lola-attention[hf]'" in done.stderr


APPLY_SHIPPED_MAPS = """
import sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM
import lola
from lola.integrations.transformers import apply_lola

# SmolLM2-135M's attention geometry (30 layers, 9 heads, 3 K/V heads, head_dim 64), tiny elsewhere
config = LlamaConfig(vocab_size=64, hidden_size=576, intermediate_size=32, num_hidden_layers=30, num_attention_heads=9,
                     num_key_value_heads=3, max_position_embeddings=256, tie_word_embeddings=True)
model = LlamaForCausalLM(config).eval()
apply_lola(model, lola.LoLAConfig(sparse_size=8, window=8, chunk=8), feature_maps="smollm2-135m-instruct")
with torch.no_grad():
    model(torch.randint(0, 64, (1, 20)))
print(sorted(m for m in sys.modules if m.startswith("lola.linearize")))
"""


def test_inference_with_shipped_maps_loads_no_training_code():
    done = subprocess.run([sys.executable, "-c", APPLY_SHIPPED_MAPS], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("old, new", sorted(__import__("lola._moved", fromlist=["MOVED"]).MOVED.items()))
def test_moved_modules_import_by_their_old_names_with_a_warning(old, new):
    import importlib
    import sys

    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)


@pytest.mark.parametrize("old, new", sorted(__import__("lola._moved", fromlist=["RENAMED_KERNEL_PACKAGES"]).RENAMED_KERNEL_PACKAGES.items()))
def test_renamed_kernel_packages_name_their_new_place_and_keep_the_function(old, new):
    import importlib

    import lola.kernels

    function = getattr(lola.kernels, old.rsplit(".", 1)[1])
    for module in (old, f"{old}.reference"):
        with pytest.raises(ModuleNotFoundError, match=f"is now {new}"):
            importlib.import_module(module)
    assert getattr(lola.kernels, old.rsplit(".", 1)[1]) is function and callable(function)
    assert importlib.import_module(f"{new}.reference").__name__ == f"{new}.reference"
