"""Kernel tests: run Triton on CPU through the interpreter unless a GPU is present.

TRITON_INTERPRET must be set before triton decorates any kernel, i.e. before the first
``lola.kernels.<package>.triton`` import, so it is set here at conftest import time. On a
CUDA machine it is left alone: the CUDA parametrisation runs compiled kernels and the
CPU-Triton cases skip (unless TRITON_INTERPRET=1 was exported on purpose).
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(autouse=True)
def single_cpu_thread():
    """These tests run many tiny CPU ops, where intra-op threading costs far more than it
    gains (10-100x slower on a 2-core box). Restored afterwards for other test folders."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture
def nan_empty(monkeypatch):
    """Make ``torch.empty`` return NaN-filled float tensors (fla's trick): unwritten outputs show."""
    real_empty = torch.empty

    def empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        if t.dtype.is_floating_point:
            t.fill_(float("nan"))
        return t

    monkeypatch.setattr(torch, "empty", empty)


@pytest.fixture
def triton_device(device, nan_empty):
    """A device the Triton kernels can run on here; skips cleanly otherwise."""
    pytest.importorskip("triton")
    if device == "cpu":
        if os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("Triton on CPU tensors needs TRITON_INTERPRET=1")
        pytest.importorskip("numpy", reason="the Triton interpreter needs numpy")
    return device
