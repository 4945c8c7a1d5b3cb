"""Shared helpers for the kernel layer: input validation and Triton settings.

Nothing here imports triton at module import time, so ``lola.kernels`` stays
importable on machines without triton or without a GPU.
"""

from __future__ import annotations

import os
from typing import Dict, Optional, Sequence, Tuple

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def is_interpreting() -> bool:
    """True when Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def block_size(n: int, lo: int = 16, hi: Optional[int] = None) -> int:
    """Power-of-two tile covering ``n``, clamped to ``[lo, hi]`` (``tl.dot`` needs >= 16)."""
    b = max(lo, next_power_of_2(n))
    return min(b, hi) if hi is not None else b


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot`` precision for fp32 x fp32 dots given the input dtype.

    16-bit x 16-bit dots are exact products with fp32 accumulation whatever the setting;
    it matters for fp32 operands (fp32 inputs, the fp32 states, upcast probabilities).
    fp32 inputs get "tf32x3" (three tf32 MMAs, ~fp32 accuracy, still tensor cores;
    "ieee" spills registers badly); 16-bit inputs get plain "tf32" (~5e-4 relative),
    which is below their own rounding.
    """
    return "tf32x3" if dtype == torch.float32 else "tf32"


def common_float_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The dtype the kernels compute in: the shared dtype, else fp32."""
    dtypes = {t.dtype for t in tensors if t is not None}
    return dtypes.pop() if len(dtypes) == 1 else torch.float32


class ShapeChecker:
    """Checks ranks and binds named dimensions across arguments.

    >>> c = ShapeChecker()
    >>> c.check("fq", fq, "B T H F")   # binds B, T, H, F
    >>> c.check("v", v, "B T H D")     # B, T, H must agree with fq
    """

    def __init__(self) -> None:
        self.sizes: Dict[str, int] = {}
        self.origin: Dict[str, str] = {}

    def check(self, name: str, t, dims: str) -> Tuple[int, ...]:
        names = dims.split()
        spec = "[" + ", ".join(names) + "]"
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a tensor of shape {spec}, got {type(t).__name__}")
        if t.dim() != len(names):
            raise ValueError(f"{name} must be {spec}, got shape {tuple(t.shape)}")
        for d, n in zip(names, t.shape):
            if d in self.sizes and self.sizes[d] != n:
                raise ValueError(f"{name} must be {spec} with {d}={self.sizes[d]} (as in {self.origin[d]}), got shape {tuple(t.shape)}")
            self.sizes.setdefault(d, int(n))
            self.origin.setdefault(d, name)
        return tuple(t.shape)

    def __getitem__(self, d: str) -> int:
        return self.sizes[d]


def check_float(name: str, t: torch.Tensor) -> None:
    if t.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be float32, float16 or bfloat16, got {t.dtype}")


def check_fp32(name: str, t: torch.Tensor) -> None:
    if t.dtype != torch.float32:
        raise ValueError(f"{name} must be float32 (states and statistics are fp32), got {t.dtype}")


def check_integer(name: str, t: torch.Tensor) -> None:
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer (int64) tensor of positions, got {t.dtype}")


def check_same_device(named: Sequence[Tuple[str, Optional[torch.Tensor]]]) -> None:
    named = [(n, t) for n, t in named if t is not None]
    first_name, first = named[0]
    for n, t in named[1:]:
        if t.device != first.device:
            raise ValueError(f"{n} must be on {first.device} like {first_name}, got {t.device}")


def check_grouped_heads(c: ShapeChecker) -> None:
    """The query heads ``H`` bound in ``c`` must be a whole multiple of the key/value heads ``Hs``
    (grouped-query attention: each k/v head serves ``H // Hs`` query heads)."""
    if c["Hs"] == 0 or c["H"] % c["Hs"] != 0:
        raise ValueError(f"q heads H={c['H']} must be a multiple of k/v heads Hs={c['Hs']}")


def check_query_and_cache(q: torch.Tensor, q_dims: str, k: torch.Tensor, v: torch.Tensor, k_pos: torch.Tensor) -> ShapeChecker:
    """Queries reading a grouped key/value cache: ``q`` float of shape ``q_dims`` (``"B H D"`` or
    ``"B H L D"``), ``k, v [B, Hs, N, D]`` float, ``k_pos [B, Hs, N]`` integer positions, and
    ``H`` a whole multiple of ``Hs`` (:func:`check_grouped_heads`).

    Returns:
        the :class:`ShapeChecker` with ``B``, ``H``, ``Hs``, ``N``, ``D`` (and ``L``) bound, for
        the op's other inputs.
    """
    c = ShapeChecker()
    c.check("q", q, q_dims)
    c.check("k", k, "B Hs N D")
    c.check("v", v, "B Hs N D")
    c.check("k_pos", k_pos, "B Hs N")
    check_grouped_heads(c)
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float(name, t)
    check_integer("k_pos", k_pos)
    return c


def check_linear_state(c: ShapeChecker, H: torch.Tensor, s: torch.Tensor) -> None:
    """A linear-attention state: ``H [B, H, F, D]`` and ``s [B, H, F]``, both fp32, with the
    dimensions already bound in ``c`` (``B``, ``H``, ``F``, ``D``) agreeing."""
    c.check("H", H, "B H F D")
    c.check("s", s, "B H F")
    check_fp32("H", H)
    check_fp32("s", s)
