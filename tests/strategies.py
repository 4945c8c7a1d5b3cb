"""Hypothesis strategies shared by the property tests."""

from __future__ import annotations

import itertools

from hypothesis import strategies as st

seeds = st.integers(0, 2**16)
"""A seed for the torch generators a test draws its weights and inputs from."""

storages = st.sampled_from(["kv_head", "query_head"])
"""``LoLAConfig.gqa_storage``: a memory per K/V head or per query head."""

Bound = int | tuple[int, int]
"""An inclusive ``(low, high)`` range to draw a size from, or one fixed size."""


def _size(bound: Bound) -> st.SearchStrategy[int]:
    return st.just(bound) if isinstance(bound, int) else st.integers(*bound)


@st.composite
def memory_sizes(draw, *, window: Bound, sparse: Bound, sinks: Bound, chunk: Bound | None = None) -> dict[str, int]:
    """A layer's memory sizes in tokens, as ``LoLAConfig`` keyword arguments: ``window``,
    ``sparse_size``, ``sinks`` and, unless ``chunk`` is None, ``chunk`` (tokens between eviction
    steps)."""
    sizes = {"window": draw(_size(window)), "sparse_size": draw(_size(sparse)), "sinks": draw(_size(sinks))}
    if chunk is not None:
        sizes["chunk"] = draw(_size(chunk))
    return sizes


@st.composite
def ragged_offsets(draw, *, heads: Bound, longest: int) -> tuple[int, ...]:
    """``RaggedSlots.offsets`` of a run over ``heads`` storage heads: ``Hs + 1`` ints from 0, each
    head's range ``0..longest`` slots long (empty ranges, and an all-empty run, included)."""
    Hs = draw(_size(heads))
    lengths = draw(st.lists(st.integers(0, longest), min_size=Hs, max_size=Hs))
    return tuple(itertools.accumulate(lengths, initial=0))
