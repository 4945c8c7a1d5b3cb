"""Choose between the Triton kernels and the pure-PyTorch references.

The choice is read at *call time*, in this order:

1. the innermost active :func:`use_backend` context (per thread), else
2. the ``LOLA_KERNELS`` environment variable, else ``"auto"``.

``auto``      Triton when every input is a CUDA tensor and triton imports, else the reference.
``triton``    always Triton. CPU tensors only work under ``TRITON_INTERPRET=1`` (set before
              triton is first imported); a missing triton raises ``RuntimeError``.
``reference`` always the pure-PyTorch reference.
``compiled``  as ``auto``, and on a CPU the ops of :data:`COMPILED_OPS` run their fused form
              compiled by ``torch.compile`` (inductor, dynamic shapes; the decode step:
              :mod:`lola.kernels.decoding.compiled`): the first calls compile (tens of
              seconds), later calls reuse the generated code.

Under ``auto``, a call that allows it (``fused=True``: the softmax partials of a caller that
reads only ``num / den`` and ``den · e^max``; every decode step) of an op with a fused form
(:data:`FUSED_OPS`: PyTorch's fused CPU attention, a decode step in few calls) runs that form on
CPU tensors that need no gradient;
``reference`` forces the definition everywhere.

Whatever is requested, a call that autograd must differentiate (grad mode on and an input
that requires grad) runs the reference: the Triton ops are forward-only, and a training step
through them would silently get wrong gradients.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib
import os
import threading
from typing import Callable, Iterator, Optional

import torch

from lola.core.thread_stack import pushed

from .utils import is_interpreting

ENV_VAR = "LOLA_KERNELS"
BACKENDS = ("auto", "triton", "reference", "compiled")

_local = threading.local()


def _validate(name: str, source: str) -> str:
    value = str(name).strip().lower()
    if value not in BACKENDS:
        raise ValueError(f"{source} must be one of {', '.join(BACKENDS)}; got {name!r}")
    return value


def requested_backend() -> str:
    """The requested backend name: ``"auto"``, ``"triton"``, ``"reference"`` or ``"compiled"``."""
    stack = getattr(_local, "stack", None)
    if stack:
        return stack[-1]
    return _env_backend(os.environ.get(ENV_VAR, "auto"))


@functools.lru_cache(maxsize=8)
def _env_backend(raw: str) -> str:
    return _validate(raw or "auto", ENV_VAR)


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Override ``LOLA_KERNELS`` for the current thread inside a ``with`` block."""
    value = _validate(name, f"use_backend() (like {ENV_VAR})")
    with pushed(_local, "stack", value):
        yield


@functools.lru_cache(maxsize=None)
def _import_triton_error() -> Optional[str]:
    """None if triton (and, under the interpreter, numpy) imports; else the error text."""
    try:
        importlib.import_module("triton")
        if is_interpreting():
            importlib.import_module("numpy")  # the interpreter runs on numpy
    except Exception as e:  # ImportError, or a broken install raising anything else
        return f"{type(e).__name__}: {e}"
    return None


def triton_available() -> bool:
    return _import_triton_error() is None


def _devices(tensors) -> list:
    out = []
    for t in tensors:
        if isinstance(t, torch.Tensor):
            out.append(t.device)
        elif isinstance(t, (torch.device, str)):
            out.append(torch.device(t))
    if not out:
        out.append(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    return out


def needs_grad(tensors) -> bool:
    """True when autograd would record an op on these inputs (grad mode on, one requires grad)."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def backend(*tensors) -> str:
    """The implementation (``"triton"`` or ``"reference"``) an op would use for these inputs.

    Accepts tensors or devices; with none, assumes CUDA if available else CPU. Inputs that
    need gradients always get the reference (the Triton ops have no backward).
    Raises like the ops do when ``triton`` is forced but cannot run.
    """
    requested = requested_backend()
    if requested == "reference" or needs_grad(tensors):
        return "reference"
    if requested in ("auto", "compiled") and any(isinstance(t, torch.Tensor) and not t.is_cuda for t in tensors):
        return "reference"  # the common CPU case, decided without building the device list
    devices = _devices(tensors)
    all_cuda = all(d.type == "cuda" for d in devices)
    if requested in ("auto", "compiled"):
        return "triton" if all_cuda and triton_available() else "reference"
    # forced triton
    err = _import_triton_error()
    if err is not None:
        raise RuntimeError(f"{ENV_VAR}=triton but triton cannot be imported ({err}); install triton or use {ENV_VAR}=reference")
    if not all_cuda and not is_interpreting():
        raise RuntimeError(
            f"{ENV_VAR}=triton on {devices[0].type} tensors needs the Triton interpreter: "
            "set TRITON_INTERPRET=1 before triton is first imported, or move the inputs to CUDA"
        )
    return "triton"


@contextlib.contextmanager
def record_calls() -> Iterator[collections.Counter]:
    """Count the ops dispatched in the current thread inside a ``with`` block.

    Yields a :class:`collections.Counter` keyed by ``(op, backend)``, e.g.
    ``{("softmax_partial", "reference"): 12, ("decode_step", "reference"): 30}``; it fills as
    ops run. Blocks nest (each counts what ran inside it). Useful to see which kernels a model
    really runs, and in tests that the engine does not bypass them.
    """
    with pushed(_local, "recorders", collections.Counter()) as counter:
        yield counter


_MODULES: dict[tuple[str, str], object] = {}

FUSED_OPS = frozenset({"softmax_partial", "decode_step"})
"""Ops with a ``fused.py`` beside their reference: fewer, fused PyTorch calls on a CPU (tested
against the reference), taken under ``auto`` where the reference would run and the call allows it."""

COMPILED_OPS = frozenset({"decode_step"})
"""Ops with a ``compiled.py`` beside their fused form (the fused form's arithmetic under
``torch.compile``), taken under ``compiled`` where ``auto`` would take the fused form."""

PACKAGE_OF_OP = {
    "chunk_linear_attention": "linear_attention",
    "softmax_partial": "exact_attention",
    "self_recall_error": "recall_error",
    "decode_step": "decoding",
}
"""Each op's package: ``reference.py`` and ``triton.py`` there define a function named after the op."""


def implementation(op: str, *tensors, fused: bool = False) -> Callable:
    """The function implementing ``op`` (a key of :data:`PACKAGE_OF_OP`) for these inputs;
    ``fused``: the caller accepts the op's fused form (:data:`FUSED_OPS`) on a CPU."""
    name = backend(*tensors)
    requested = requested_backend()
    if fused and name == "reference" and op in FUSED_OPS and requested in ("auto", "compiled") and not needs_grad(tensors):
        if all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in tensors):
            name = "compiled" if requested == "compiled" and op in COMPILED_OPS else "fused"
    for counter in getattr(_local, "recorders", ()):
        counter[(op, name)] += 1
    module = _MODULES.get((op, name))
    if module is None:  # first use: import (per call, the lookup would cost more than a small op)
        try:
            module = _MODULES[(op, name)] = importlib.import_module(f"{__package__}.{PACKAGE_OF_OP[op]}.{name}")
        except ImportError as e:  # e.g. the jit decorator failing to set up the interpreter
            raise RuntimeError(f"cannot load the {name} implementation of {op}: {e}") from e
    return getattr(module, op)
