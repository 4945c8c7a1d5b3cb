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

import functools

import torch

from . import fused

__all__ = ["decode_step"]

decode_step = functools.partial(fused.decode_step, core=torch.compile(fused.decode_core, dynamic=True))
""":func:`lola.kernels.decode_step` by :func:`.fused.decode_step` with its core compiled (same
arguments and result; the core compiles at its first call)."""
