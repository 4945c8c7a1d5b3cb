"""One decode step in few PyTorch calls (the decode step on a CPU), and the mix of a
prefill's partials in two passes over its reads.

The reference (:mod:`.reference`) builds the step from the library's general parts: softmax
partials shifted by their max (:func:`~lola.kernels.softmax_partial`), the linear read, and
:func:`~lola.core.mixing.mix_partials`, which divides, weighs and caps in separate passes. On a
CPU a decoded token is bound by the number of calls, not by their arithmetic (one query per
head over a few hundred slots): this form computes the same output in about half the calls.

The exact sums are shifted by the max ``m`` as the reference's are (``E_num, E_den``), so every
rule is ``o = (a E_num + b L_num) / (a E_den + b L_den)`` with the weights of
:func:`~lola.core.mixing.mixing_weights`, and the cap compares the same share. The reference stays the
definition; this form is tested against it (``tests/kernels/test_decoding_fused.py``).
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple, Union

import torch

from lola.core.mixing import mixing_weights

from ..exact_attention.reference import _slot_heads
from ..ragged import RaggedSlots
from . import reference

__all__ = ["decode_core", "decode_step", "mix_partials"]


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
    *,
    core: Optional[Callable] = None,
) -> torch.Tensor:
    """:func:`lola.kernels.decode_step` in few calls (same arguments and result).

    Args:
        q: ``[B, H, D]``; k, v: ``[B, Hs, N, D]``; k_pos: ``[B, Hs, N]`` (``-1`` = empty);
        fq: ``[B, H, F]``; H: ``[B, H, F, D]``; s: ``[B, H, F]`` (``None`` with
        ``softmax_only``); gate: ``[H]``; ragged: a run of extra slots per storage head, or
        ``None``; share_cap: ``[B]``, or ``None``.
        core: what runs the step's arithmetic: :func:`decode_core` (``None``), or that function
            compiled (:mod:`lola.kernels.decoding.compiled`).

    Returns:
        ``o [B, H, D]`` fp32.
    """
    if mixing == "softmax_only" and ragged is None:
        return reference.softmax_over_slots(q, k, v, k_pos, scale)
    # The run's owner per slot is built (and kept) on the host side: its length depends on the
    # layout's values, which a compiled core would otherwise have to trace.
    run = None if ragged is None else (ragged.k, ragged.v, ragged.pos, _slot_heads(tuple(ragged.offsets), q.device))
    return (core or decode_core)(q, k, v, k_pos, fq, H, s, gate, mixing, scale, run, share_cap)


def decode_core(
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
    run: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]],
    share_cap: Optional[torch.Tensor],
) -> torch.Tensor:
    """:func:`decode_step`'s arithmetic on tensors alone (no host-side value read: one graph for
    torch.compile). ``run``: the ragged slots' ``k, v [B, S, D]``, ``pos [B, S]`` and owning
    storage head ``[S]`` int64, or ``None``."""
    B, Hq, D = q.shape
    Hs, N = k.shape[1], k.shape[2]
    G = Hq // Hs
    qs = q.float() * scale  # [B, H, D]
    scores = (qs.view(B, Hs, G, D) @ k.float().transpose(-1, -2)).view(B, Hq, N)
    visible = k_pos >= 0  # [B, Hs, N]
    if run is not None:
        # Every query head scores the whole run as one product of [B, H, D] by [B, D, S] (no
        # copy of the run per head); other heads' slots are masked like empty ones.
        run_k, run_v, run_pos, heads = run
        own = (heads == torch.arange(Hs, device=q.device)[:, None])[None] & (run_pos >= 0)[:, None, :]  # [B, Hs, S]
        scores = torch.cat([scores, qs @ run_k.float().transpose(1, 2)], dim=-1)  # [B, H, N + S]
        visible = torch.cat([visible, own], dim=-1)
    scores = scores.view(B, Hs, G, -1).masked_fill(~visible[:, :, None, :], float("-inf")).view(B, Hq, -1)
    m = scores.amax(-1) if scores.shape[-1] else scores.new_full(scores.shape[:-1], float("-inf"))  # [B, H]
    # nothing visible: m = -inf, shifted by a finite number so that exp(-inf) = 0 (as the reference)
    p = torch.exp(scores - m.clamp_min(torch.finfo(torch.float32).min)[..., None])
    e_num = (p[..., :N].view(B, Hs, G, N) @ v.float()).view(B, Hq, D)
    if run is not None:
        e_num = e_num + p[..., N:] @ run[1].float()
    e_den = p.sum(-1)  # [B, H]
    if mixing == "softmax_only":
        return _divide(e_num, e_den)
    fqf = fq.float()
    l_num = (fqf[:, :, None] @ H.float()).squeeze(-2)  # [B, H, D]
    l_den = (fqf * s.float()).sum(-1)  # [B, H]
    w = gate.float().view(1, Hq)
    if mixing == "lola_authors":  # unshifted sums e^m E, both sides scaled by e^{-c}, c = max(m, 0)
        c = m.clamp_min(0.0)
        a, b = w * torch.exp(m - c), (1 - w) * torch.exp(-c)
    else:
        a, b = w, (torch.ones_like(w) if mixing == "lolcats" else 1 - w)
    lin_den = b * l_den
    den = a * e_den + lin_den
    o = _divide(a[..., None] * e_num + b[..., None] * l_num, den)
    if share_cap is not None:
        # Where the state's share b·L_den / den exceeds the row's cap (and an exact slot is
        # visible), the two reads mixed at the cap (lola.core.mixing.mix_partials).
        cap = share_cap.float().view(B, 1)
        share = _divide(lin_den[..., None], den)[..., 0]
        capped = cap[..., None] * _divide(l_num, l_den) + (1 - cap[..., None]) * _divide(e_num, e_den)
        o = torch.where(((share > cap) & (e_den > 0))[..., None], capped, o)
    return o


def mix_partials(
    e_num: torch.Tensor,
    e_den: torch.Tensor,
    e_max: torch.Tensor,
    l_num: torch.Tensor,
    l_den: torch.Tensor,
    gate: torch.Tensor,
    mixing: str,
    share_cap: Optional[Union[float, torch.Tensor]] = None,
) -> torch.Tensor:
    """:func:`lola.core.mixing.mix_partials` in two passes over the ``[..., D]`` reads.

    Every rule's output is ``ce · E_num + cl · L_num`` with one coefficient of each read per
    output, computed on the ``[B, H, L]`` scalars: ``a / den`` and ``b / den`` (the weights of
    :func:`~lola.core.mixing.mixing_weights`, ``den = a E_den + b L_den``), and where the cap
    holds, ``(1 − c) / E_den`` and ``c / L_den``; ``0`` where a denominator is ``0``. The
    reference divides, weighs and caps the ``[B, H, L, D]`` reads in separate passes (a prefill
    of 2K tokens: 24 ms a layer against 2 ms here on one CPU thread; a decoded token's few
    values are mixed inside :func:`decode_step`, in fewer calls than this). Forward only: a divide
    masked by ``where`` has no finite gradient where the denominator is ``0``.

    Args:
        e_num: ``[B, H, L, D]``; e_den, e_max: ``[B, H, L]``; l_num: ``[B, H, L, D]``; l_den:
            ``[B, H, L]`` (unused with ``softmax_only``); gate: ``[H]``; share_cap: ``None``,
            a number, or a tensor broadcastable to ``[B, H, L]``.

    Returns:
        ``o`` of ``e_num``'s shape, fp32.
    """
    e_num, e_den = e_num.float(), e_den.float()
    if mixing == "softmax_only":
        return e_num * _inverse(e_den)[..., None]
    a, b = mixing_weights(e_max, gate, mixing)
    l_den = l_den.float()
    lin = b * l_den
    den_inv = _inverse(a * e_den + lin)
    ce, cl = a * den_inv, b * den_inv
    if share_cap is not None:
        # Where the state's share b·L_den / den exceeds the cap (and an exact slot is visible),
        # the two reads mixed at the cap: (1 − c) E_num / E_den + c L_num / L_den.
        c = share_cap.float() if isinstance(share_cap, torch.Tensor) else torch.tensor(float(share_cap))
        over = (lin * den_inv > c) & (e_den > 0)
        ce = torch.where(over, (1 - c) * _inverse(e_den), ce)
        cl = torch.where(over, c * _inverse(l_den), cl)
    return (e_num * ce[..., None]).addcmul_(l_num.float(), cl.expand(e_den.shape)[..., None])


def _inverse(x: torch.Tensor) -> torch.Tensor:
    """``1 / x``, ``0`` where ``x == 0``."""
    return torch.where(x == 0, 0.0, 1.0 / x)


def _divide(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``num / den[..., None]``, ``0`` where ``den == 0``."""
    return torch.where((den == 0)[..., None], 0.0, num / den[..., None])
