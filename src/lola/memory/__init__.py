"""Memory systems of a LoLA layer: sinks, sliding window, sparse cache and linear state."""

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
    check_role,
    exact_logits,
    partial_from_logits,
)
from lola.memory.linear_state import LinearState
from lola.memory.query_stats import QueryStatistics
from lola.memory.sinks import SinkTokens
from lola.memory.slots import SlotBuffer
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
    "check_role",
    "KVBlock",
    "LinearState",
    "MemorySystem",
    "QueryBlock",
    "QueryStatistics",
    "SinkTokens",
    "SlotBuffer",
    "SlidingWindow",
    "SparseCache",
    "exact_logits",
    "partial_from_logits",
]
