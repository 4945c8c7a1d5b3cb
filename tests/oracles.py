"""Independent, deliberately naive implementations the tests compare lola against.

Nothing here imports lola's engine: dense masks, explicit loops and Python sets only.
"""

from __future__ import annotations

import torch


def rel_err(ref: torch.Tensor, out: torch.Tensor) -> float:
    """‖ref − out‖ / ‖ref‖ in float64 (absolute error when ref is zero)."""
    ref, out = ref.detach().double(), out.detach().double()
    denom = ref.norm()
    diff = (ref - out).norm()
    return float(diff / denom) if denom > 0 else float(diff)


def assert_rel_close(ref: torch.Tensor, out: torch.Tensor, ratio: float = 1e-5, what: str = "") -> None:
    assert ref.shape == out.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    assert torch.isfinite(out.detach()).all(), f"{what}: non-finite values"
    err = rel_err(ref, out)
    assert err <= ratio, f"{what}: relative RMSE {err:.3e} > {ratio:.1e}"


def repeat_kv(x: torch.Tensor, group: int) -> torch.Tensor:
    """``[B, T, H_kv, D] -> [B, T, H_kv·group, D]`` (query head h reads K/V head h // group)."""
    return x.repeat_interleave(group, dim=2)


def causal_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Exact causal softmax attention, ``q: [B, T, H, D]``, ``k, v: [B, T, H_kv, D]`` → ``[B, T, H, D]``."""
    g = q.shape[2] // k.shape[2]
    k, v = repeat_kv(k, g).double(), repeat_kv(v, g).double()
    s = torch.einsum("bihd,bjhd->bhij", q.double(), k) * scale
    t = q.shape[1]
    s = s.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    return torch.einsum("bhij,bjhd->bihd", torch.softmax(s, -1), v)


def recurrent_linear_attention(fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Naive token loop: ``y_t = φ(q_t)ᵀ Σ_{j≤t} φ(k_j)v_jᵀ / φ(q_t)ᵀ Σ_{j≤t} φ(k_j)``.

    ``fq, fk: [B, T, H, F]``, ``v: [B, T, H, D]`` (already per query head) → ``[B, T, H, D]``.
    """
    b, t, h, f = fq.shape
    H = torch.zeros(b, h, f, v.shape[-1], dtype=torch.float64)
    s = torch.zeros(b, h, f, dtype=torch.float64)
    out = []
    for i in range(t):
        H = H + fk[:, i].double().unsqueeze(-1) * v[:, i].double().unsqueeze(-2)
        s = s + fk[:, i].double()
        num = torch.einsum("bhf,bhfd->bhd", fq[:, i].double(), H)
        den = torch.einsum("bhf,bhf->bh", fq[:, i].double(), s)
        out.append(num / den.unsqueeze(-1))
    return torch.stack(out, dim=1)


def hybrid_exact_mask(t: int, window: int, sinks: int, chunk: int) -> torch.Tensor:
    """``[T, T]`` bool: key j is exact for query p in the sliding-window + linear hybrid (no sparse cache).

    Steps run after positions C−1, 2C−1, …; after the last step at or before p (position
    b), the window keeps positions > b − η; sinks are positions < ``sinks``.
    """
    mask = torch.zeros(t, t, dtype=torch.bool)
    for p in range(t):
        last_step = ((p + 1) // chunk) * chunk - 1  # -1: no step yet
        lo = last_step - window + 1 if last_step >= 0 else 0
        for j in range(p + 1):
            mask[p, j] = j < sinks or j >= lo
    return mask


def step_decay_weights(t: int, chunk: int, decay: float) -> torch.Tensor:
    """``[T, T]`` float64: the weight ``γ^{b − j}`` of key j in the linear state that query p reads,
    ``b`` the last step at or before p (steps after positions C−1, 2C−1, …: the state is read as
    of its last step). Ones when ``decay = 1``."""
    p = torch.arange(t)
    last_step = ((p + 1) // chunk) * chunk - 1
    age = (last_step[:, None] - p[None, :]).clamp_min(0).double()
    return torch.full((t, t), float(decay), dtype=torch.float64) ** age


def rope(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """``x [..., D]`` rotated to ``pos [...]`` in float64, rotate-half layout over the first
    ``2·len(inv_freq)`` dimensions: ``x1 cos − x2 sin, x2 cos + x1 sin`` (transformers' Llama)."""
    r = 2 * inv_freq.numel()
    angle = pos.double()[..., None] * inv_freq.double()
    cos, sin = angle.cos(), angle.sin()
    x = x.double()
    x1, x2 = x[..., : r // 2], x[..., r // 2 : r]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., r:]], dim=-1)


def lolcats_hybrid(q, k, v, fq, fk, exact_mask, gate, scale, affine=False, linear_weights=None, share_cap=None, cap_from=0, logits=None):
    """LoLCATs mixing over a dense exact mask; the rest of the causal past is linear.

    ``q: [B, T, H, D]``; ``k, v: [B, T, H, D]`` per query head; ``fq, fk: [B, T, H, F]``;
    ``exact_mask: [T, T]``; ``gate: [H]`` softmax weight; ``linear_weights``: optional ``[T, T]``
    weight of each linear key for each query (a decay, :func:`step_decay_weights`);
    ``share_cap``: the linear part's share of each output, ``lw·Σa / (w·Σp + lw·Σa)``, at most
    this (the two parts' own averages mixed at the cap), for the queries at positions ``>= cap_from``.
    ``logits``: ``[B, H, T, T]`` exact logits in place of ``q·k·scale`` (keys at assigned positions).
    Returns ``[B, T, H, D]`` (float64).
    """
    t = q.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    lin_mask = causal & ~exact_mask
    s = torch.einsum("bihd,bjhd->bhij", q.double(), k.double()) * scale if logits is None else logits.double()
    s = s.masked_fill(~exact_mask, float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, 0.0)
    p = torch.exp(s - m)
    a = torch.einsum("bihf,bjhf->bhij", fq.double(), fk.double()) * lin_mask
    if linear_weights is not None:
        a = a * linear_weights
    w = gate.double().view(1, -1, 1, 1)
    lw = (1 - w) if affine else torch.ones_like(w)
    num = torch.einsum("bhij,bjhd->bhid", w * p + lw * a, v.double())
    den = (w * p + lw * a).sum(-1)
    out = num / den.unsqueeze(-1)
    if share_cap is not None:
        lin_mass, exact_mass = (lw * a).sum(-1), (w * p).sum(-1)
        share = lin_mass / (lin_mass + exact_mass)
        y_lin = torch.einsum("bhij,bjhd->bhid", a, v.double()) / a.sum(-1, keepdim=True).clamp_min(1e-300)
        y_exact = torch.einsum("bhij,bjhd->bhid", p, v.double()) / p.sum(-1, keepdim=True).clamp_min(1e-300)
        capped = share_cap * y_lin + (1 - share_cap) * y_exact
        seen = p.sum(-1) > 0  # a query that sees no exact token keeps the linear read
        applies = torch.arange(t) >= cap_from  # [T]
        out = torch.where((seen & (share > share_cap) & applies).unsqueeze(-1), capped, out)
    return out.transpose(1, 2)


def smooth_directional_derivative(f, h: float, tol: float) -> float | None:
    """``d/dt f(t)`` at ``t = 0`` by finite differences, or ``None`` where ``f`` is not smooth on ``[−h, h]``.

    ``f(t) -> float`` is evaluated at ``0, ±h/2, ±h``. The estimate is Richardson's extrapolation
    of the central differences at ``h`` and ``h/2`` (error ``O(h⁴)``, so the step can be large
    enough for float32's rounding). A kink (a max changing its argument) or a jump inside the
    interval shows as central differences that disagree between the two steps, or as second
    differences that do (a kink at ``t₀`` adds ``J(h − |t₀|)/h²`` to the second difference,
    which no single step cancels for both tests at once); then there is no derivative to
    compare with and the result is ``None``. ``tol`` bounds both disagreements relative to
    ``max(1, |estimate|)``.
    """
    at = {t: float(f(t)) for t in (-h, -h / 2, 0.0, h / 2, h)}
    wide, narrow = (at[h] - at[-h]) / (2 * h), (at[h / 2] - at[-h / 2]) / h
    curve_wide = (at[h] - 2 * at[0.0] + at[-h]) / h**2
    curve_narrow = (at[h / 2] - 2 * at[0.0] + at[-h / 2]) / (h / 2) ** 2
    estimate = (4 * narrow - wide) / 3
    scale = max(1.0, abs(estimate))
    if abs(wide - narrow) > tol * scale or h * abs(curve_wide - curve_narrow) > tol * scale:
        return None
    return estimate
