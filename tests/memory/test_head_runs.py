"""The run layout of per-head slots: head ``h``'s first ``w_h`` slots, one after another."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lola.memory import EMPTY, KVBlock, SparseCache
from lola.memory.head_runs import HeadRuns
from lola.memory.slots import SlotBuffer


def _padded(b: int, widths: list[int], d: int, seed: int, acc: bool) -> KVBlock:
    """A padded block whose slots past each head's width are empty (the stores' contract)."""
    g = torch.Generator().manual_seed(seed)
    w = max(widths)
    k, v = torch.randn(b, len(widths), w, d, generator=g), torch.randn(b, len(widths), w, d, generator=g)
    pos = torch.randint(-1, 100, (b, len(widths), w), generator=g)
    tally = torch.rand(b, len(widths), w, generator=g) if acc else None
    for h, width in enumerate(widths):
        k[:, h, width:] = 0
        v[:, h, width:] = 0
        pos[:, h, width:] = EMPTY
        if tally is not None:
            tally[:, h, width:] = 0
    return KVBlock(k, v, pos, tally)


def _run_by_definition(block: KVBlock, widths: list[int]) -> KVBlock:
    """The run as the layout is defined: each head's first ``w_h`` slots concatenated."""

    def cat(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else torch.cat([t[:, h, :w] for h, w in enumerate(widths)], dim=1).unsqueeze(1)

    return KVBlock(cat(block.k), cat(block.v), cat(block.pos), cat(block.acc))


WIDTHS = st.lists(st.integers(0, 6), min_size=1, max_size=5).filter(lambda w: max(w) > 0)


@settings(max_examples=60, deadline=None)
@given(WIDTHS, st.integers(1, 3), st.integers(0, 10**6), st.booleans())
def test_pack_is_the_heads_runs_concatenated_and_unpack_inverts_it(widths, batch, seed, acc):
    runs = HeadRuns(widths)
    block = _padded(batch, widths, 3, seed, acc)
    run = runs.pack(block)
    want = _run_by_definition(block, widths)
    for got, expected in zip((run.k, run.v, run.pos, run.acc), (want.k, want.v, want.pos, want.acc)):
        assert (got is None) == (expected is None)
        if got is not None:
            assert torch.equal(got, expected)
    back = runs.unpack(run)
    for got, expected in zip((back.k, back.v, back.pos, back.acc), (block.k, block.v, block.pos, block.acc)):
        assert (got is None) == (expected is None)
        if got is not None:
            assert torch.equal(got, expected)
    assert runs.offsets[-1] == runs.total == sum(widths) and list(runs.offsets[1:]) == list(torch.tensor(widths).cumsum(0))


def test_shapes_that_do_not_fit_the_widths_are_refused():
    runs = HeadRuns([2, 0, 3])
    with pytest.raises(ValueError, match=r"3 heads × 3 slots was expected"):
        runs.pack(_padded(1, [2, 2], 2, 0, False))
    with pytest.raises(ValueError, match=r"a run of 5 slots per row"):
        runs.unpack(_run_by_definition(_padded(1, [2, 2], 2, 0, False), [2, 2]))
    with pytest.raises(ValueError, match="per-head widths"):
        HeadRuns([])
    with pytest.raises(ValueError, match="per-head widths"):
        HeadRuns([1, -1])


@settings(max_examples=30, deadline=None)
@given(WIDTHS, st.integers(1, 3), st.integers(0, 10**6))
def test_a_store_held_ragged_saves_its_run_as_a_store_on_its_own_does(widths, batch, seed):
    """The sparse cache's saved state is the same layout whether its composer holds it ragged
    (handed over as held) or it keeps a padded block of its own (packed on save), and loading
    either into the other gives the same slots."""
    block = _padded(batch, widths, 3, seed, False)
    alone = SparseCache(widths)
    run = _run_by_definition(block, widths)
    alone.load_state_dict({"k": run.k, "v": run.v, "pos": run.pos, "head_sizes": torch.tensor([widths] * batch)})
    slots = SlotBuffer([("sparse", widths)])
    held = SparseCache(widths)
    held.bind(slots)
    slots.allocate(batch, len(widths), 3, torch.float32, torch.device("cpu"), False)
    held.load_state_dict(alone.state_dict())
    saved_alone, saved_held = alone.state_dict(), held.state_dict()
    assert saved_alone.keys() == saved_held.keys() == {"k", "v", "pos", "head_sizes"}
    for key in saved_alone:
        assert torch.equal(saved_alone[key], saved_held[key])
    assert saved_held["k"].data_ptr() != slots.run.k.data_ptr()  # a copy: the run is written in place later
    assert torch.equal(held.block.k, block.k) and torch.equal(held.block.pos, block.pos)
    # Loaded as a copy (with autograd on, the copy-on-write path): a later in-place write of the
    # run leaves the loaded state and another store loaded from it untouched.
    other_slots = SlotBuffer([("sparse", widths)])
    other = SparseCache(widths)
    other.bind(other_slots)
    other_slots.allocate(batch, len(widths), 3, torch.float32, torch.device("cpu"), False)
    source = alone.state_dict()
    kept = {key: t.clone() for key, t in source.items()}
    held.load_state_dict(source)
    other.load_state_dict(source)
    with torch.no_grad():
        slots.run.k.add_(1.0)
    assert all(torch.equal(source[key], kept[key]) for key in kept)
    assert torch.equal(other_slots.run.k, kept["k"])
