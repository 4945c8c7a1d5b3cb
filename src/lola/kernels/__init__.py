"""LoLA kernel layer: four fused ops, each with a pure-PyTorch reference.

Ops (shapes in each docstring):

- :func:`chunk_linear_attention` causal linear-attention numerator/denominator (prefill)
- :func:`softmax_partial`        exact-attention partials over a sparse cache
- :func:`self_recall_error`      how badly a linear state recalls each token
- :func:`decode_step`            one decode token: exact + linear part, mixed

Each op lives in ``lola.kernels.<op>/`` with ``reference.py`` (the definition, also the
CPU path) and ``triton.py`` (the fused kernels). Which one runs is decided per call
(:mod:`lola.kernels.dispatch`): env var ``LOLA_KERNELS=auto|triton|reference`` or the
:func:`use_backend` context manager. :func:`backend` tells which one would run;
:func:`record_calls` counts the ops that did.

Note: the attribute ``lola.kernels.<op>`` is the *function*; import the modules with
``from lola.kernels.<op> import reference`` (not ``import lola.kernels.<op>.reference as``).
"""

from .chunk_linear_attention import chunk_linear_attention
from .decode_step import MIXING_RULES, decode_step, mix_partials
from .dispatch import BACKENDS, ENV_VAR, backend, record_calls, requested_backend, triton_available, use_backend
from .self_recall_error import self_recall_error
from .softmax_partial import softmax_partial

__all__ = [
    "chunk_linear_attention",
    "softmax_partial",
    "self_recall_error",
    "decode_step",
    "mix_partials",
    "MIXING_RULES",
    "backend",
    "record_calls",
    "requested_backend",
    "triton_available",
    "use_backend",
    "BACKENDS",
    "ENV_VAR",
]
