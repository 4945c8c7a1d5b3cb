"""LoLA kernel layer: four fused ops, each with a pure-PyTorch reference.

Ops (shapes in each docstring), each in a package named for what it computes:

- :func:`chunk_linear_attention` (``linear_attention/``): causal linear-attention numerator and
  denominator (prefill)
- :func:`softmax_partial` (``exact_attention/``): exact-attention partials over cached slots
- :func:`self_recall_error` (``recall_error/``): how badly a linear state recalls each token
- :func:`decode_step` (``decoding/``): one decode token: exact + linear part, mixed

Both exact ops read, besides a dense cache, an optional ragged run of slots per storage head
(:class:`RaggedSlots`, defined by :func:`pad_ragged`).

Each package holds ``reference.py`` (the definition, also the CPU path) and ``triton.py``
(the fused kernels). Which one runs is decided per call
(:mod:`lola.kernels.dispatch`): env var ``LOLA_KERNELS=auto|triton|reference`` or the
:func:`use_backend` context manager. :func:`backend` tells which one would run;
:func:`record_calls` counts the ops that did.
"""

from .decoding import MIXING_RULES, decode_step, mix_partials
from .dispatch import BACKENDS, ENV_VAR, backend, record_calls, requested_backend, triton_available, use_backend
from .exact_attention import softmax_partial
from .linear_attention import chunk_linear_attention
from .ragged import RaggedSlots, pad_ragged
from .recall_error import self_recall_error

__all__ = [
    "chunk_linear_attention",
    "softmax_partial",
    "self_recall_error",
    "decode_step",
    "mix_partials",
    "MIXING_RULES",
    "RaggedSlots",
    "pad_ragged",
    "backend",
    "record_calls",
    "requested_backend",
    "triton_available",
    "use_backend",
    "BACKENDS",
    "ENV_VAR",
]
