"""A per-thread list that a ``with`` block adds to: the kernel dispatch's backend overrides and
call recorders (:mod:`lola.kernels.dispatch`) and the layer's observers (:mod:`lola.layer`)."""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator, TypeVar

__all__ = ["pushed"]

T = TypeVar("T")


@contextlib.contextmanager
def pushed(local: threading.local, name: str, item: T) -> Iterator[T]:
    """Append ``item`` to the list ``local.<name>`` (created on first use) for a ``with`` block.

    The list is per thread (``local`` is a :class:`threading.local`), so blocks in other threads
    never see the item. On exit that very item is removed (the last entry that *is* it, not one
    that merely equals it: two recorders' counters can be equal), whatever the block raised.

    Yields:
        ``item``.
    """
    items = getattr(local, name, None)
    if items is None:
        items = []
        setattr(local, name, items)
    items.append(item)
    try:
        yield item
    finally:
        for i in range(len(items) - 1, -1, -1):
            if items[i] is item:
                del items[i]
                break
