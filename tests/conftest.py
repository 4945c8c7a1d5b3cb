"""Shared test set-up: NaN-filled ``torch.empty`` and hypothesis profiles."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings

settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
# For mutation runs: report the first failing example without shrinking it.
settings.register_profile("no_shrink", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True, phases=[Phase.explicit, Phase.reuse, Phase.generate])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

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
