"""The decode step's fused CPU form, compiled by ``torch.compile`` (``LOLA_KERNELS=compiled``).

The fused decode step (:mod:`lola.kernels.decoding.fused`: one token's read of every exact
slot and the linear state, mixed, in few PyTorch calls) is plain PyTorch; inductor turns it
into generated C++ loops, fusing the elementwise passes between the matrix products. Shapes
are dynamic (one graph for every batch, slot count and ragged layout that take the same
branches), so a model compiles it a few times, not once per layer. The fused form stays the
tested definition of what is compiled (``tests/kernels/test_compiled.py`` holds the two equal
to the reference). The prefill's reads are not compiled: their fused form is one call of
PyTorch's own fused attention already, which inductor does not lower with dynamic shapes.

Whether it pays depends on the machine: docs/performance.md ("torch.compile on a CPU") has
the measurements; ``auto`` does not compile.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

__all__ = ["COMPILED_OPS", "compiled_form"]

COMPILED_OPS = frozenset({"decode_step"})
"""Ops whose fused CPU form ``LOLA_KERNELS=compiled`` compiles (the others run as under ``auto``)."""


@functools.lru_cache(maxsize=None)
def compiled_form(op: str) -> Callable:
    """The fused CPU form of ``op`` (one of :data:`COMPILED_OPS`) under
    ``torch.compile(dynamic=True)``; compiled at its first call, one wrapper per op."""
    if op not in COMPILED_OPS:
        raise ValueError(f"op {op!r} has no compiled form; ops with one: {sorted(COMPILED_OPS)}")
    from .decoding import fused

    # The step's arithmetic is compiled; the wrapper around it builds the ragged run's owners
    # on the host (a length that depends on values would break the graph).
    return functools.partial(fused.decode_step, core=torch.compile(fused.decode_core, dynamic=True))
