"""One LoLA decode step: exact attention over the cache + linear state, mixed."""

from __future__ import annotations

from typing import Optional, Union

import torch

from lola.core.mixing import MIXING_RULES, check_mixing
from lola.core.mixing import mix_partials as mix_partials_reference

from ..dispatch import implementation, needs_grad, requested_backend
from ..ragged import RaggedSlots, check_ragged
from ..utils import check_float, check_linear_state, check_query_and_cache, check_same_device
from . import fused


def check_inputs(q, k, v, k_pos, fq, H, s, gate, mixing, ragged=None) -> None:
    check_mixing(mixing)
    c = check_query_and_cache(q, "B H D", k, v, k_pos)
    c.check("gate", gate, "H")
    check_float("gate", gate)
    tensors = [("q", q), ("k", k), ("v", v), ("k_pos", k_pos), ("gate", gate)]
    linear = (("fq", fq), ("H", H), ("s", s))
    if mixing == "softmax_only" and all(t is None for _, t in linear):
        pass  # the linear part is unused
    else:
        c.check("fq", fq, "B H F")
        check_linear_state(c, H, s)
        check_float("fq", fq)
        tensors += list(linear)
    check_same_device(tensors)
    if ragged is not None:
        check_ragged("ragged", ragged, k, v)


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
    *,
    ragged: Optional[RaggedSlots] = None,
    share_cap: Optional[torch.Tensor] = None,
    check: bool = True,
) -> torch.Tensor:
    """Attention output for one new query token per row.

    Exact part: softmax partials of ``q`` over every non-empty cache slot (``k_pos >= 0``),
    those of ``ragged`` included.
    Linear part: ``L_num = fq^T H``, ``L_den = fq^T s``. Mixed by ``mixing`` (see
    :func:`lola.core.mixing.mix_partials`); a zero denominator gives 0.

    Args:
        q: ``[B, H, D]`` query (fp32/fp16/bf16).
        k, v: ``[B, Hs, N, D]`` cache keys / values, ``H % Hs == 0``.
        k_pos: ``[B, Hs, N]`` int64 positions, ``-1`` = empty slot.
        fq: ``[B, H, F]`` query features (None allowed for ``softmax_only``).
        H: ``[B, H, F, D]`` fp32 linear state (None allowed for ``softmax_only``).
        s: ``[B, H, F]`` fp32 normaliser state (None allowed for ``softmax_only``).
        gate: ``[H]`` fp32 softmax weight ``w`` per head (already sigmoid-ed).
        mixing: ``"lolcats" | "lolcats_affine" | "lola_authors" | "softmax_only"``.
        scale: logit scale.
        ragged: extra slots per storage head (:class:`~lola.kernels.RaggedSlots`: ``k, v
            [B, S, D]``, ``pos [B, S]``, head ``h`` owns ``offsets[h]:offsets[h + 1]``); the
            same as concatenating :func:`~lola.kernels.pad_ragged` to the cache along ``N``.
            ``None``: only the cache.
        share_cap: ``[B]`` fp32, the linear state's largest share of each row's output where an
            exact slot is visible (``1``: no cap; :func:`lola.core.mixing.mix_partials`), or
            ``None``: no cap. Not with ``softmax_only`` (the state has no share to cap).
        check: validate shapes, dtypes and devices first (``False`` only for callers that
            built the inputs themselves, such as the LoLA engine on its decode path).

    Returns:
        ``o [B, H, D]`` fp32 (the caller casts).
    """
    if check:
        check_inputs(q, k, v, k_pos, fq, H, s, gate, mixing, ragged)
        if share_cap is not None:
            check_share_cap(share_cap, q, mixing)
    extra = () if ragged is None else (ragged.k, ragged.v, ragged.pos)  # they decide the backend too
    fn = implementation("decode_step", q, k, v, fq, H, s, gate, *extra, fused=True)  # (the fused form is exact: any rule)
    return fn(q, k, v, k_pos, fq, H, s, gate, mixing, scale, ragged, share_cap)


def mix_partials(
    e_num: torch.Tensor,
    e_den: torch.Tensor,
    e_max: torch.Tensor,
    l_num: Optional[torch.Tensor],
    l_den: Optional[torch.Tensor],
    gate: torch.Tensor,
    mixing: str,
    share_cap: Optional[Union[float, torch.Tensor]] = None,
) -> torch.Tensor:
    """Mix exact softmax partials with linear-attention partials: the definition is
    :func:`lola.core.mixing.mix_partials` (same arguments and result, up to rounding).

    Under ``LOLA_KERNELS=auto`` or ``triton`` and without gradients, the form of
    :mod:`.fused` runs (two passes over the ``[B, H, L, D]`` reads, on any device); under
    ``reference``, or when autograd must differentiate, the definition.
    """
    check_mixing(mixing)
    if requested_backend() == "reference" or needs_grad((e_num, e_den, e_max, l_num, l_den, gate, share_cap)):
        return mix_partials_reference(e_num, e_den, e_max, l_num, l_den, gate, mixing, share_cap)
    return fused.mix_partials(e_num, e_den, e_max, l_num, l_den, gate, mixing, share_cap)


def check_share_cap(share_cap: torch.Tensor, q: torch.Tensor, mixing: str) -> None:
    """``share_cap`` must be a ``[B]`` floating tensor of values in ``(0, 1]`` on ``q``'s device,
    and the rule one that mixes (``softmax_only`` has no share to cap)."""
    if mixing == "softmax_only":
        raise ValueError("share_cap needs a rule that mixes the linear state; softmax_only does not read it")
    if not isinstance(share_cap, torch.Tensor) or tuple(share_cap.shape) != (q.shape[0],) or not share_cap.is_floating_point():
        got = f"{tuple(share_cap.shape)} {share_cap.dtype}" if isinstance(share_cap, torch.Tensor) else type(share_cap).__name__
        raise ValueError(f"share_cap must be a [B] = ({q.shape[0]},) floating tensor (one cap per row), got {got}")
    if share_cap.device != q.device:
        raise ValueError(f"share_cap must be on {q.device}, got {share_cap.device}")
    if not bool(((share_cap > 0) & (share_cap <= 1)).all()):
        raise ValueError("share_cap must hold values in (0, 1] (1: no cap)")


__all__ = ["decode_step", "mix_partials", "MIXING_RULES", "check_inputs", "check_share_cap"]
