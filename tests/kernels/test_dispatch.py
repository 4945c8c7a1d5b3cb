import os
import subprocess
import sys
import textwrap

import pytest
import torch

import lola.kernels as K
from lola.kernels import dispatch
from lola.kernels.exact_attention import reference as sp_ref


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    monkeypatch.delenv("LOLA_KERNELS", raising=False)


def cpu_tensor():
    return torch.zeros(1)


def test_auto_is_default_and_picks_reference_on_cpu():
    assert K.requested_backend() == "auto"
    assert K.backend(cpu_tensor()) == "reference"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_auto_picks_triton_on_cuda():
    pytest.importorskip("triton")
    assert K.backend(torch.zeros(1, device="cuda")) == "triton"


@pytest.mark.parametrize("value", ["reference", "REFERENCE", " reference "])
def test_env_reference_honoured(monkeypatch, value):
    monkeypatch.setenv("LOLA_KERNELS", value)
    assert K.backend(cpu_tensor()) == "reference"


def test_env_triton_honoured_under_interpreter(monkeypatch):
    pytest.importorskip("triton")
    pytest.importorskip("numpy")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("LOLA_KERNELS", "triton")
    assert K.backend(cpu_tensor()) == "triton"


def test_invalid_env_value_raises(monkeypatch):
    monkeypatch.setenv("LOLA_KERNELS", "cuda")
    with pytest.raises(ValueError, match=r"LOLA_KERNELS must be one of auto, triton, reference, compiled; got 'cuda'"):
        K.backend(cpu_tensor())
    q = torch.zeros(1, 1, 1, 4)
    with pytest.raises(ValueError, match="LOLA_KERNELS"):
        K.softmax_partial(q, q, q, torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, 1, dtype=torch.long), 1.0)


def test_use_backend_overrides_env_and_nests(monkeypatch):
    monkeypatch.setenv("LOLA_KERNELS", "triton")
    with K.use_backend("reference"):
        assert K.requested_backend() == "reference"
        with K.use_backend("auto"):
            assert K.backend(cpu_tensor()) == "reference"
        assert K.requested_backend() == "reference"
    assert K.requested_backend() == "triton"
    with pytest.raises(ValueError, match="LOLA_KERNELS"):
        with K.use_backend("fast"):
            pass


def test_forced_triton_without_triton_raises(monkeypatch):
    monkeypatch.setattr(dispatch, "_import_triton_error", lambda: "ImportError: No module named 'triton'")
    monkeypatch.setenv("LOLA_KERNELS", "triton")
    with pytest.raises(RuntimeError, match="triton cannot be imported"):
        K.backend(cpu_tensor())
    monkeypatch.setenv("LOLA_KERNELS", "auto")
    assert K.backend(cpu_tensor()) == "reference"


def test_forced_triton_on_cpu_without_interpreter_raises(monkeypatch):
    monkeypatch.setattr(dispatch, "_import_triton_error", lambda: None)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with K.use_backend("triton"), pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        K.backend(cpu_tensor())


def test_ops_call_the_chosen_implementation(monkeypatch):
    calls = []
    real = sp_ref.softmax_partial

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(sp_ref, "softmax_partial", spy)
    q = torch.randn(1, 2, 3, 8)
    kv = torch.randn(1, 1, 5, 8)
    q_pos = torch.arange(3)[None]
    k_pos = torch.arange(5)[None, None]
    K.softmax_partial(q, kv, kv, q_pos, k_pos, 1.0)  # auto on CPU
    assert calls == [1]
    with K.use_backend("reference"):
        K.softmax_partial(q, kv, kv, q_pos, k_pos, 1.0)
    assert calls == [1, 1]


def test_import_without_triton_works():
    # A fresh interpreter where `import triton` fails: lola.kernels must import and run.
    code = textwrap.dedent(
        """
        import sys
        sys.modules["triton"] = None  # makes `import triton` raise ImportError
        import torch
        import lola.kernels as K
        assert K.backend(torch.zeros(1)) == "reference"
        assert not K.triton_available()
        x = torch.rand(1, 4, 1, 8)
        num, den, _ = K.chunk_linear_attention(x, x, x)
        assert num.shape == (1, 4, 1, 8)
        try:
            with K.use_backend("triton"):
                K.chunk_linear_attention(x, x, x)
        except RuntimeError as e:
            assert "triton cannot be imported" in str(e)
        else:
            raise AssertionError("expected RuntimeError")
        print("ok")
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "LOLA_KERNELS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert "ok" in out.stdout


def test_inputs_that_need_gradients_get_the_reference(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("LOLA_KERNELS", "triton")
    x = torch.zeros(2, requires_grad=True)
    assert K.backend(x) == "reference"  # the Triton ops have no backward
    with torch.no_grad():
        assert K.backend(x) == "triton"
    assert K.backend(x.detach()) == "triton"


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter case")
def test_a_training_step_under_forced_triton_has_the_reference_gradients():
    """One LoLA layer, forward + backward: forcing Triton must not change any gradient."""
    pytest.importorskip("triton")
    import lola

    cfg = lola.LoLAConfig(window=6, sparse_size=5, sinks=2, chunk=4, mixing="lola_authors", feature_map="hedgehog", feature_dim=8)
    torch.manual_seed(0)
    attn = lola.compose(cfg, num_heads=4, head_dim=8, num_kv_heads=2)
    g = torch.Generator().manual_seed(1)
    inputs = [torch.randn(1, 23, h, 8, generator=g) for h in (4, 2, 2)]

    def grads(name):
        attn.zero_grad()
        leaves = [t.clone().requires_grad_(True) for t in inputs]
        with K.use_backend(name):
            o, _ = attn(*leaves)
        o.square().sum().backward()
        return [t.grad for t in leaves] + [p.grad.clone() for p in attn.parameters() if p.grad is not None]

    ref, forced = grads("reference"), grads("triton")
    assert len(ref) == len(forced) > 3
    for a, b in zip(ref, forced):
        torch.testing.assert_close(a, b)
