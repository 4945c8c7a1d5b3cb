"""The decode step's fused CPU form with its arithmetic compiled by ``torch.compile``
(``LOLA_KERNELS=compiled``).

The fused decode step (:mod:`.fused`: one token's read of every exact slot and the linear
state, mixed, in few PyTorch calls) runs its arithmetic in :func:`.fused.decode_core`, a
function of tensors alone; inductor turns it into generated C++ loops, fusing the elementwise
passes between the matrix products. Shapes are dynamic (one graph for every batch, slot count
and ragged layout that take the same branches), so a model compiles it a few times, not once
per layer; the first calls compile (tens of seconds). The fused form stays the definition of
what is compiled (``tests/kernels/test_compiled.py`` holds the two equal to the reference).
Whether it pays depends on the machine: docs/performance.md, "torch.compile on a CPU".
"""

from __future__ import annotations

from typing import Optional

import torch

from ..ragged import RaggedSlots
from . import fused

__all__ = ["decode_step"]

_core = torch.compile(fused.decode_core, dynamic=True)  # (compiles at its first call)


def decode_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_pos: torch.Tensor,
    fq: Optional[torch.Tensor],
    H: Optional[torch.Tensor],
    s: Optional[torch.Tensor],
    gate: torch.Tensor,
    mixing: str,
    scale: float,
    ragged: Optional[RaggedSlots] = None,
    share_cap: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """:func:`lola.kernels.decode_step` by :func:`.fused.decode_step` with a compiled core (same
    arguments and result)."""
    return fused.decode_step(q, k, v, k_pos, fq, H, s, gate, mixing, scale, ragged, share_cap, core=_core)
