"""Shared test set-up: NaN-filled ``torch.empty`` and hypothesis profiles."""

from __future__ import annotations

import os

import pytest
import torch

# Triton kernels run on CPU tensors through the interpreter; it must be switched on before
# triton is first imported. On a CUDA machine the real kernels are tested instead.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
from hypothesis import HealthCheck, Phase, settings

settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
# For mutation runs: report the first failing example without shrinking it.
settings.register_profile(
    "no_shrink", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True, phases=[Phase.explicit, Phase.reuse, Phase.generate]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# Tiny tensors: one thread avoids oversubscription slowdowns on small CI machines.
torch.set_num_threads(1)

_real_empty = torch.empty


def _nan_empty(*args, **kwargs):
    # Anything that reads memory it never wrote sees NaN and fails loudly (fla's trick).
    out = _real_empty(*args, **kwargs)
    if out.is_floating_point():
        out.fill_(float("nan"))
    return out


@pytest.fixture(autouse=True, scope="session")
def nan_filled_empty():
    torch.empty = _nan_empty
    yield
    torch.empty = _real_empty
