"""`import lola` (memories, policies, schedules, kernels, the layer) needs neither transformers nor peft."""

import subprocess
import sys

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
    assert done.returncode != 0 and "lola.apply_lola needs transformers, from the hf extra (pip install 'lola[hf]')" in done.stderr


def test_the_command_line_names_the_extra_to_install(tmp_path):
    done = _run("from lola.cli import main\nmain(['--help'])")
    assert done.returncode == 0 and "niah" in done.stdout  # the parser itself needs no extra
    out = tmp_path / "run"
    done = _run(f"import sys\nfrom lola.cli import main\nsys.exit(main(['niah', '--model', 'tiny-random-llama', '--out', {str(out)!r}]))")
    assert done.returncode == 2, done.stderr
    assert "lola niah: error: needs transformers, from the hf extra: pip install 'lola[hf]'" in done.stderr
