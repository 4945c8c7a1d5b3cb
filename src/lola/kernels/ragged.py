"""A ragged run of exact slots: one flat run per batch row, a contiguous range per storage head.

Heads that keep very different numbers of exact tokens (sparse budgets such as ``[1110, 7, 50]``)
would waste memory and reads in a dense ``[B, Hs, N, D]`` cache padded to the largest. A
:class:`RaggedSlots` run stores them back to back instead (like ``cu_seqlens`` in
flash-linear-attention): storage head ``h`` owns slots ``offsets[h]:offsets[h + 1]``. The exact
ops (:func:`lola.kernels.softmax_partial`, :func:`lola.kernels.decode_step`) read such a run
besides their dense cache; :func:`pad_ragged` defines what that means.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional, Tuple

import torch

from .utils import ShapeChecker


class RaggedSlots(NamedTuple):
    """Extra exact slots of every storage head, stored as one flat run per batch row.

    Storage head ``h`` reads slots ``offsets[h]:offsets[h + 1]`` of every row; they join its
    dense cache slots (same visibility rule: by position, ``-1`` = empty slot).

    Attributes:
        k, v: ``[B, S, D]`` keys and values, the dtype of the dense cache.
        pos: ``[B, S]`` int64 positions, ``-1`` = empty slot.
        offsets: ``Hs + 1`` host ints, ``offsets[0] == 0``, nondecreasing, ``offsets[-1] == S``
            (a tuple: the kernels cache its device copy by value).
    """

    k: torch.Tensor
    v: torch.Tensor
    pos: torch.Tensor
    offsets: Tuple[int, ...]


def check_ragged(name: str, ragged, k: torch.Tensor, v: torch.Tensor) -> None:
    """Validate a ragged run read alongside the dense cache ``k, v [B, Hs, N, D]`` (already checked).

    ``ragged.k, ragged.v`` must be ``[B, S, D]`` with the dtypes of ``k, v``, ``ragged.pos``
    ``[B, S]`` int64, all on ``k``'s device, and ``ragged.offsets`` a tuple of ``Hs + 1`` ints
    from 0 up to ``S``, nondecreasing. Raises ``TypeError``/``ValueError`` naming the field.
    """
    if not isinstance(ragged, RaggedSlots):
        raise TypeError(f"{name} must be a RaggedSlots (k, v, pos, offsets) or None, got {type(ragged).__name__}")
    c = ShapeChecker()
    c.check("k", k, "B Hs N D")
    c.check(f"{name}.k", ragged.k, "B S D")
    c.check(f"{name}.v", ragged.v, "B S D")
    c.check(f"{name}.pos", ragged.pos, "B S")
    for field, t, like in (("k", ragged.k, k), ("v", ragged.v, v)):
        if t.dtype != like.dtype:
            raise ValueError(f"{name}.{field} must be {like.dtype} like the cache's {field}, got {t.dtype}")
    if ragged.pos.dtype != torch.int64:
        raise ValueError(f"{name}.pos must be an int64 tensor of positions, got {ragged.pos.dtype}")
    for field in ("k", "v", "pos"):
        t = getattr(ragged, field)
        if t.device != k.device:
            raise ValueError(f"{name}.{field} must be on {k.device} like k, got {t.device}")
    check_offsets(f"{name}.offsets", ragged.offsets, c["Hs"], c["S"])


def check_offsets(name: str, offsets, Hs: int, S: int) -> None:
    """``offsets``: a tuple of ``Hs + 1`` host ints, ``0`` first, nondecreasing, ``S`` last."""
    if not isinstance(offsets, tuple) or not all(type(o) is int for o in offsets):
        raise TypeError(f"{name} must be a tuple of Hs+1={Hs + 1} ints, got {type(offsets).__name__} {offsets!r:.80}")
    if len(offsets) != Hs + 1:
        raise ValueError(f"{name} must hold Hs+1={Hs + 1} ints (a range per storage head), got {len(offsets)}")
    if offsets[0] != 0 or offsets[-1] != S:
        raise ValueError(f"{name} must run from 0 to S={S} (the run's length), got {offsets[0]}..{offsets[-1]}")
    bad = next((h for h in range(Hs) if offsets[h + 1] < offsets[h]), None)
    if bad is not None:
        raise ValueError(f"{name} must be nondecreasing, got {offsets[bad]} then {offsets[bad + 1]} (head {bad})")


def pad_ragged(ragged: RaggedSlots, Hs: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The run as a dense cache, each head's range padded to the longest: the *definition*.

    An op given ``ragged=r`` equals the same op on its dense cache concatenated along ``N`` with
    ``pad_ragged(r, Hs)``.

    Args:
        ragged: the run (``offsets`` of length ``Hs + 1``).
        Hs: storage heads.

    Returns:
        ``(k [B, Hs, L, D], v [B, Hs, L, D], pos [B, Hs, L])`` with ``L`` the longest range;
        slots past a head's range are empty (``pos = -1``, ``k = v = 0``).
    """
    check_offsets("ragged.offsets", ragged.offsets, Hs, ragged.k.shape[1])
    o = ragged.offsets
    lengths = [o[h + 1] - o[h] for h in range(Hs)]
    B, D = ragged.k.shape[0], ragged.k.shape[2]
    L = max(lengths, default=0)
    k = ragged.k.new_zeros(B, Hs, L, D)
    v = ragged.v.new_zeros(B, Hs, L, D)
    pos = ragged.pos.new_full((B, Hs, L), -1)
    for h, n in enumerate(lengths):
        k[:, h, :n] = ragged.k[:, o[h] : o[h + 1]]
        v[:, h, :n] = ragged.v[:, o[h] : o[h + 1]]
        pos[:, h, :n] = ragged.pos[:, o[h] : o[h + 1]]
    return k, v, pos


def device_offsets(offsets: Tuple[int, ...], device: torch.device) -> torch.Tensor:
    """``offsets`` as an int64 tensor on ``device``, for the kernels; cached, so a decode loop
    over the same layout copies it to the device once."""
    return _device_offsets(tuple(offsets), str(device))


@functools.lru_cache(maxsize=256)
def _device_offsets(offsets: Tuple[int, ...], device: str) -> torch.Tensor:
    return torch.tensor(offsets, dtype=torch.int64, device=device)


def kernel_args(ragged: Optional[RaggedSlots], like: torch.Tensor, dtype: torch.dtype):
    """A Triton kernel's ragged arguments ``(rk, rv, r_pos, r_offsets, S)``: the run contiguous,
    ``k, v`` in ``dtype``, and its device offsets; with no run (or an empty one) ``S = 0`` and
    ``like`` in place of the tensors, which the kernel then never reads."""
    if ragged is None or ragged.k.shape[1] == 0:
        return like, like, like, like, 0
    rk, rv = (x.to(dtype).contiguous() for x in (ragged.k, ragged.v))
    return rk, rv, ragged.pos.to(torch.int64).contiguous(), device_offsets(ragged.offsets, like.device), ragged.k.shape[1]


__all__ = ["RaggedSlots", "check_ragged", "check_offsets", "pad_ragged", "device_offsets", "kernel_args"]
