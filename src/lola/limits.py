"""Upper bounds of sizes, shared by every schema that validates them (configs, policy options).

Bounds catch typos before anything is allocated; the memory a state will need is checked
separately, against the memory there is, when it is allocated (:func:`lola.memory.allocation.check_allocation`).
"""

from __future__ import annotations

__all__ = ["MAX_FEATURE_DIM", "MAX_HEADS", "MAX_HEAD_DIM", "MAX_LAYERS", "MAX_SCALE", "MAX_TOKENS"]

MAX_TOKENS = 2**24
"""Most tokens one memory (window, sparse cache, sinks) or one chunk may hold: 16.7 M, far
beyond any context a LoLA layer is meant to compress (a typo such as ``window=10**12`` would
otherwise only fail when the storage is allocated)."""
MAX_FEATURE_DIM = 2**14
"""Largest Hedgehog projection size ``f`` (the linear state holds ``2f × D`` floats per head)."""
MAX_HEAD_DIM = 2**14
"""Largest head dimension ``D`` of a layer (models use 64–256; every state tensor is ``D`` wide)."""
MAX_HEADS = 2**16
"""Most entries of a per-head size list."""
MAX_LAYERS = 2**12
"""Most layers a model description (a feature-map folder's geometry) may claim."""

MAX_SCALE = 1e3
"""Largest attention scale (the default is ``1/sqrt(head_dim)``, below 1): beyond it a logit
of ordinary size overflows float32's exponential."""
