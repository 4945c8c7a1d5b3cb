"""Shared test set-up: NaN-filled ``torch.empty`` and hypothesis profiles."""

from __future__ import annotations

import os
import sys
import textwrap

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
        with torch.no_grad():  # a leaf asked for with requires_grad=True (torch.compile makes some) is filled too
            out.fill_(float("nan"))
    return out


@pytest.fixture
def installed_plugin(tmp_path, monkeypatch):
    """``install(module, source, group, name, attr)``: a fake installed distribution (a module
    ``module.py`` of ``source`` and its ``module-1.0.dist-info``) that publishes ``module:attr``
    as entry point ``name`` of ``group``, importable from ``tmp_path``. Plugins are found through
    the installed packages' metadata, so a test of that route needs one installed."""
    installed = []

    def install(module: str, source: str, group: str, name: str, attr: str) -> None:
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
        dist = tmp_path / f"{module}-1.0.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 1.0\n")
        (dist / "entry_points.txt").write_text(f"[{group}]\n{name} = {module}:{attr}\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        installed.append(module)

    yield install
    for module in installed:
        sys.modules.pop(module, None)


@pytest.fixture(autouse=True, scope="session")
def nan_filled_empty():
    torch.empty = _nan_empty
    yield
    torch.empty = _real_empty
