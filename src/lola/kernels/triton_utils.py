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
