"""Shared test helpers for the kernel tests."""

import importlib
from collections.abc import Sequence

import torch

from lola.kernels.dispatch import PACKAGE_OF_OP
from lola.kernels.ragged import RaggedSlots, pad_ragged

DTYPES = [torch.float32, torch.bfloat16]


def assert_close_rel(ref: torch.Tensor, out: torch.Tensor, ratio: float, name: str = "", floor: float = 0.0) -> None:
    """``||ref - out|| / max(||ref||, floor) <= ratio`` (absolute when that is 0); no NaN/inf.
    ``floor``: the size of the terms a cancelling sum is made of (its rounding is relative to
    them, not to the sum)."""
    assert ref.shape == out.shape, f"{name}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    out = out.detach().to(device="cpu", dtype=torch.float64)
    ref = ref.detach().to(device="cpu", dtype=torch.float64)
    fin = torch.isfinite(ref)
    assert torch.equal(fin, torch.isfinite(out)), f"{name}: non-finite entries differ"
    assert torch.equal(ref[~fin], out[~fin]), f"{name}: infinite entries differ"
    ref, out = ref[fin], out[fin]
    err = (ref - out).norm().item()
    scale = max(ref.norm().item(), floor)
    rel = err / scale if scale > 0 else err
    assert rel <= ratio, f"{name}: relative error {rel:.3e} > {ratio:.1e}"


def assert_outputs_close(
    ref: Sequence[torch.Tensor], out: Sequence[torch.Tensor], ratio: float, names: Sequence[str], floors: dict[str, float] | None = None
) -> None:
    """:func:`assert_close_rel` output by output: ``ref[i]`` against ``out[i]``, named ``names[i]``
    (``names`` may go on past the outputs compared); ``floors``: per name, the size of the
    terms a cancelling output sums (see :func:`assert_close_rel`)."""
    assert len(ref) == len(out), f"{len(out)} outputs, {len(ref)} expected"
    for name, r, o in zip(names, ref, out):
        assert_close_rel(r, o, ratio, name, (floors or {}).get(name, 0.0))


def tolerance(dtype: torch.dtype) -> float:
    """Triton vs reference: fp32 inputs use tf32x3 dots (~fp32); 16-bit ones use tf32 on GPU."""
    return 1e-5 if dtype == torch.float32 else 5e-3


def triton_impl(op: str):
    """The Triton implementation of ``op`` (import deferred until triton is known importable)."""
    return getattr(importlib.import_module(f"lola.kernels.{PACKAGE_OF_OP[op]}.triton"), op)


def reference_module(op: str):
    return importlib.import_module(f"lola.kernels.{PACKAGE_OF_OP[op]}.reference")


def make_ragged(B, offsets, D, dtype=torch.float32, device="cpu", empty_frac=0.25, max_pos=64, seed=0) -> RaggedSlots:
    """A ragged run with storage head ``h`` owning slots ``offsets[h]:offsets[h + 1]``: random
    keys and values, positions in ``[0, max_pos)``, a share ``empty_frac`` of slots empty (-1)."""
    g = torch.Generator().manual_seed(seed)
    S = offsets[-1]
    k, v = torch.randn(B, S, D, generator=g), torch.randn(B, S, D, generator=g)
    pos = torch.randint(0, max(max_pos, 1), (B, S), generator=g)
    pos[torch.rand(B, S, generator=g) < empty_frac] = -1
    return RaggedSlots(k.to(dtype=dtype, device=device), v.to(dtype=dtype, device=device), pos.to(device), tuple(offsets))


def padded_cache(k, v, k_pos, ragged: RaggedSlots):
    """The oracle's cache: the dense ``k, v [B, Hs, N, D]``, ``k_pos [B, Hs, N]`` concatenated
    along ``N`` with :func:`pad_ragged` of the run (what an op given ``ragged=`` must equal)."""
    pk, pv, pp = pad_ragged(ragged, k.shape[1])
    return torch.cat([k, pk], 2), torch.cat([v, pv], 2), torch.cat([k_pos, pp], 2)
