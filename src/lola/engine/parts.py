"""What the engine reads of a layer's parts: their declared capabilities, never their types.

A memory *declares* that its composer may hold its slots (``binds``) and, with per-head sizes,
hold them ragged (``ragged``); a subclass that overrides how slots are read or written loses
the declaration (:func:`lola.memory.base.drop_unless_declared`). These helpers read the
declarations for :class:`lola.engine.state.LayerState`, and describe a part for its spec.
"""

from __future__ import annotations

__all__ = ["binds_buffer", "describe_part", "slot_widths"]


def binds_buffer(memory: object) -> bool:
    """Whether ``memory`` keeps its slots in its composer's buffer (a stock store, or a subclass
    that reads and writes them only through ``block``)."""
    return getattr(memory, "binds", False) is True  # declared, not merely truthy (a method, a mock)


def slot_widths(memory: object) -> int | list[int]:
    """A store's slots per head: its per-head sizes (``head_sizes``) when the buffer holds it
    (``binds``) ragged (``ragged``: its slots past a head's size are always empty), else its capacity."""
    sizes = getattr(memory, "head_sizes", None)
    held_ragged = binds_buffer(memory) and getattr(memory, "ragged", False) is True and isinstance(sizes, (list, tuple))
    return list(sizes) if held_ragged else memory.capacity


def describe_part(part: object) -> str:
    """``repr(part)``, or its class and capacity when the class keeps object's default repr
    (which names a memory address and would make every fresh state look different)."""
    if type(part).__repr__ is object.__repr__:
        return f"{type(part).__module__}.{type(part).__qualname__}(capacity={getattr(part, 'capacity', None)})"
    return repr(part)
