"""Triton-side helpers shared by the kernels (imports triton: only load from ``triton.py`` files)."""

from __future__ import annotations

import contextlib
import os

import torch
import triton
import triton.language as tl

from .utils import is_interpreting

# Triton's CPU interpreter matmuls bfloat16 operands as their raw uint16 bits (3.x bug).
# Under the interpreter every dot is therefore upcast to fp32: exact for 16-bit inputs
# (their products fit fp32) and so the same result the GPU's fp32-accumulating MMA gives.
_INTERPRET_UPCAST = tl.constexpr(is_interpreting())


def device_guard(t: torch.Tensor):
    """Launch on the tensor's GPU (Triton launches on the *current* CUDA device)."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def autotune_configs(gpu_configs, default_config):
    """Configs for ``@triton.autotune``: only ``default_config`` under the interpreter (it
    cannot autotune over several) or when ``LOLA_AUTOTUNE=0`` (tests: skips compiling every
    config for every key). Read when the kernel modules are first imported."""
    if is_interpreting() or os.environ.get("LOLA_AUTOTUNE", "1") == "0":
        return [default_config]
    return gpu_configs


@triton.jit
def dot(a, b, PRECISION: tl.constexpr):
    """``tl.dot(a, b)`` accumulating in fp32; interpreter-safe for bf16 operands."""
    if _INTERPRET_UPCAST:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        out = tl.dot(a, b, input_precision=PRECISION)
    return out


@triton.jit
def cache_tile_scores(b_q, k, v, k_pos, row, i_n, N, scale, o_d, m_d, D: tl.constexpr, BN: tl.constexpr, PRECISION: tl.constexpr):
    """Read one tile of keys of a k/v head's cache and score the query rows against it.

    Args:
        b_q: ``[R, BD]`` query rows (``BD >= D``, zero past ``D``).
        k, v: ``[rows, N, D]`` contiguous keys and values, a row per (batch, k/v head);
            k_pos: ``[rows, N]`` int64 positions, ``-1`` = empty slot.
        row: the (int64) row read; i_n: the tile's first key.
        o_d, m_d: ``[BD]`` offsets over ``D`` and their mask.

    Returns:
        ``(b_s [R, BN] scaled scores q·k, unmasked; b_v [BN, BD]; b_kpos [BN], -1 past N)``:
        the caller hides the keys its queries may not see before :func:`online_softmax_tile`.
    """
    return slot_tile_scores(b_q, k, v, k_pos, row * N, i_n, N, scale, o_d, m_d, D, BN, PRECISION)


@triton.jit
def slot_tile_scores(b_q, k, v, k_pos, base, i_n, n, scale, o_d, m_d, D: tl.constexpr, BN: tl.constexpr, PRECISION: tl.constexpr):
    """:func:`cache_tile_scores` on any run of ``n`` slots from slot ``base``: keys
    ``base + [i_n, i_n + BN)``, those at or past ``base + n`` masked. The run starts anywhere
    (a ragged run's head range); counting tiles from 0 keeps ``i_n`` a multiple of ``BN``,
    which the compiler uses (looping over ``[start, end)`` instead took the bf16 decode kernel
    from 163 to 255 registers on sm_90).

    Args:
        k, v: ``[slots, D]`` contiguous; k_pos: ``[slots]`` int64, ``-1`` = empty slot.
        base: the (int64) run's first slot; i_n: the tile's first slot in the run;
            n: the run's length.

    Returns:
        ``(b_s [R, BN], b_v [BN, BD], b_kpos [BN])`` as :func:`cache_tile_scores`.
    """
    o_n = i_n + tl.arange(0, BN)
    m_n = o_n < n
    o_s = base + o_n
    b_kt = tl.load(k + o_s[None, :] * D + o_d[:, None], mask=m_d[:, None] & m_n[None, :], other=0.0)
    b_v = tl.load(v + o_s[:, None] * D + o_d[None, :], mask=m_n[:, None] & m_d[None, :], other=0.0)
    b_kpos = tl.load(k_pos + o_s, mask=m_n, other=-1)
    b_s = dot(b_q, b_kt, PRECISION) * scale
    return b_s, b_v, b_kpos


@triton.jit
def ragged_range(offsets, head):
    """``(start, length)`` of storage head ``head``'s range in a ragged run (``offsets``:
    ``[Hs + 1]`` int64 on the device), as int32."""
    start = tl.load(offsets + head)
    end = tl.load(offsets + head + 1)
    return start.to(tl.int32), (end - start).to(tl.int32)


@triton.jit
def online_softmax_tile(b_m, b_l, b_acc, b_s, b_v, PRECISION: tl.constexpr):
    """Fold one tile of keys into a running softmax (flash attention's online max).

    Args:
        b_m, b_l: ``[R]`` fp32 running max and denominator of each query row.
        b_acc: ``[R, D]`` fp32 running numerator.
        b_s: ``[R, N]`` the tile's scaled scores, ``-inf`` where a key is hidden.
        b_v: ``[N, D]`` the tile's values.

    Returns:
        ``(b_m, b_l, b_acc)`` after the tile. A row that has seen nothing keeps ``max = -inf``
        and shifts by 0, so no NaN appears.
    """
    b_m_new = tl.maximum(b_m, tl.max(b_s, axis=1))
    b_shift = tl.where(b_m_new == float("-inf"), 0.0, b_m_new)
    b_alpha = tl.exp(b_m - b_shift)
    b_p = tl.exp(b_s - b_shift[:, None])
    b_l = b_l * b_alpha + tl.sum(b_p, axis=1)
    b_acc = b_acc * b_alpha[:, None] + dot(b_p, b_v.to(tl.float32), PRECISION)
    return b_m_new, b_l, b_acc
