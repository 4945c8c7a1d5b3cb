"""Memory systems of a LoLA layer: sinks, sliding window, sparse cache and linear state.

What a custom memory needs: the role protocols it implements, the shipped memories to subclass,
:class:`ExactStore` (the base of the exact ones), the blocks it reads and writes
(:class:`KVBlock`, :class:`QueryBlock`, :data:`EMPTY`) and the two functions of an exact read
(:func:`exact_logits`, :func:`partial_from_logits`). The engine's own parts (its slot buffer,
its role check) live in their modules.
"""

import warnings

from lola.memory.base import (
    EMPTY,
    ExactMemory,
    ExactStore,
    KVBlock,
    LinearMemory,
    MemorySystem,
    QueryBlock,
    SinkMemory,
    SparseMemory,
    WindowMemory,
    exact_logits,
    partial_from_logits,
)
from lola.memory.linear_state import LinearState
from lola.memory.query_stats import QueryStatistics
from lola.memory.sinks import SinkTokens
from lola.memory.sparse import SparseCache
from lola.memory.window import SlidingWindow

__all__ = [
    "EMPTY",
    "ExactMemory",
    "ExactStore",
    "LinearMemory",
    "SinkMemory",
    "SparseMemory",
    "WindowMemory",
    "KVBlock",
    "LinearState",
    "MemorySystem",
    "QueryBlock",
    "QueryStatistics",
    "SinkTokens",
    "SlidingWindow",
    "SparseCache",
    "exact_logits",
    "partial_from_logits",
]

_ENGINE_PARTS = {"SlotBuffer": "lola.memory.slots", "check_role": "lola.memory.base"}


def __getattr__(name: str):
    # the engine's parts, once exported here: still found, with the module they live in
    module = _ENGINE_PARTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lola.memory' has no attribute {name!r}")
    warnings.warn(f"lola.memory.{name} is the engine's: import it from {module}", DeprecationWarning, stacklevel=2)
    import importlib

    return getattr(importlib.import_module(module), name)
