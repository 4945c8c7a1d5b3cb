"""Shared test helpers for the kernel tests."""

import importlib
from collections.abc import Sequence

import torch

from lola.kernels.dispatch import PACKAGE_OF_OP

DTYPES = [torch.float32, torch.bfloat16]


def assert_close_rel(ref: torch.Tensor, out: torch.Tensor, ratio: float, name: str = "") -> None:
    """``||ref - out|| / ||ref|| <= ratio`` (absolute when ``ref`` is all zeros); no NaN/inf."""
    assert ref.shape == out.shape, f"{name}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    out = out.detach().to(device="cpu", dtype=torch.float64)
    ref = ref.detach().to(device="cpu", dtype=torch.float64)
    fin = torch.isfinite(ref)
    assert torch.equal(fin, torch.isfinite(out)), f"{name}: non-finite entries differ"
    assert torch.equal(ref[~fin], out[~fin]), f"{name}: infinite entries differ"
    ref, out = ref[fin], out[fin]
    err = (ref - out).norm().item()
    scale = ref.norm().item()
    rel = err / scale if scale > 0 else err
    assert rel <= ratio, f"{name}: relative error {rel:.3e} > {ratio:.1e}"


def assert_outputs_close(ref: Sequence[torch.Tensor], out: Sequence[torch.Tensor], ratio: float, names: Sequence[str]) -> None:
    """:func:`assert_close_rel` output by output: ``ref[i]`` against ``out[i]``, named ``names[i]``
    (``names`` may go on past the outputs compared)."""
    assert len(ref) == len(out), f"{len(out)} outputs, {len(ref)} expected"
    for name, r, o in zip(names, ref, out):
        assert_close_rel(r, o, ratio, name)


def tolerance(dtype: torch.dtype) -> float:
    """Triton vs reference: fp32 inputs use tf32x3 dots (~fp32); 16-bit ones use tf32 on GPU."""
    return 1e-5 if dtype == torch.float32 else 5e-3


def triton_impl(op: str):
    """The Triton implementation of ``op`` (import deferred until triton is known importable)."""
    return getattr(importlib.import_module(f"lola.kernels.{PACKAGE_OF_OP[op]}.triton"), op)


def reference_module(op: str):
    return importlib.import_module(f"lola.kernels.{PACKAGE_OF_OP[op]}.reference")
