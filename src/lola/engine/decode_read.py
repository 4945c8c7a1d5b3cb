"""Decode: the read of one new token per row, fused with the mix (the block loop's other reader).

Decode is the block loop (:mod:`lola.engine.block_loop`) over a segment of one token: the
token's key and value go into their ring slot, a select-and-evict step runs if the schedule
says so, and then :class:`DecodeRead` reads the token: one :func:`lola.kernels.decode_step`
over every exact slot (the dense ``[sinks | window]`` and the ragged sparse run) and the linear
state, mixed by the layer's rule in the same call.
"""

from __future__ import annotations

import torch

from lola.engine.state import LayerState
from lola.kernels import decode_step
from lola.kernels.ragged import RaggedSlots

__all__ = ["DecodeRead"]


class DecodeRead:
    """The read of one decoded token per row, for the block loop (the counterpart of
    :class:`~lola.engine.segment_reads.SegmentReads`): one :func:`lola.kernels.decode_step` call reads every exact slot and
    the linear state and mixes, when the loop reads the token (after its step, if one fell on it).

    Args:
        memory: the layer's state.
        q: ``[B, H, 1, D]``; fq: ``[B, H, 1, F]``, or ``None`` (``softmax_only``).
        scale: softmax scale; gate: ``[H]`` softmax weight per head; mixing: a
            :data:`lola.core.mixing.MIXING_RULES` name.
        share_cap: ``[B]`` the linear state's largest share per row (``1``: none), or ``None``.
    """

    def __init__(
        self, memory: LayerState, q: torch.Tensor, fq: torch.Tensor | None, scale: float, gate: torch.Tensor, mixing: str, share_cap: torch.Tensor | None = None
    ) -> None:
        self.memory, self.q, self.fq, self.scale, self.gate, self.mixing = memory, q, fq, scale, gate, mixing
        self.share_cap = share_cap
        self._out: torch.Tensor | None = None

    def add(self, start: int, count: int) -> None:
        """Read the token if ``count`` is 1 (the loop asks for ``0`` queries before a step)."""
        if count == 0:
            return
        # Every stored slot is at or before the new token, so all are visible to it.
        mem = self.memory
        block = mem.exact_slots()
        H, s = mem.linear.state if self.fq is not None else (None, None)
        fq = None if self.fq is None else self.fq[:, :, 0]
        ragged = mem.ragged_slots()
        k = block.k
        if mem.positions is not None and mem.positions.moves_exact(mem.counts.host_range()[1] - 1):  # keys as the token reads them
            lo, newest = (x - 1 for x in mem.counts.host_range())
            first = mem.seen - 1  # the token's position
            if lo == newest:  # rows at one position: the slots' views of this schedule period, rotated once
                k = mem.dense_view(block, newest)
                ragged = None if ragged is None else mem.ragged_view(ragged, newest)
            else:
                k = mem.exact_view(block.k, block.pos, first, newest)
                if ragged is not None:
                    ragged = RaggedSlots(mem.exact_view(ragged.k, ragged.pos, first, newest), ragged.v, ragged.pos, ragged.offsets)
        self._out = decode_step(
            self.q[:, :, 0], k, block.v, block.pos, fq, H, s, self.gate, self.mixing, self.scale, ragged=ragged, share_cap=self.share_cap, check=False
        )

    def result(self) -> torch.Tensor:
        """``[B, H, D]`` float32 outputs."""
        if self._out is None:
            raise RuntimeError("the token was not read (internal error)")
        return self._out
