import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lola.memory import KVBlock, SparseCache


def test_select_keeps_top_scores_and_returns_the_rest():
    cache = SparseCache(2)
    cache.allocate(1, 1, 1, torch.float32, torch.device("cpu"), False)
    pos = torch.tensor([[[5, 6, 7, -1]]])
    k = torch.arange(4.0).view(1, 1, 4, 1)
    cands = KVBlock(k, k, pos)
    evicted = cache.select(cands, torch.tensor([[[0.1, 0.9, 0.5, 9.0]]]), torch.tensor([True]))
    assert sorted(cache.block.pos[0, 0].tolist()) == [6, 7]  # the empty slot's high score is ignored
    assert [int(p) for p in evicted.pos[0, 0] if p >= 0] == [5]


@settings(max_examples=40)
@given(perm_seed=st.integers(0, 2**16), capacity=st.integers(1, 4), per_head=st.booleans())
def test_equal_scores_keep_the_older_tokens_wherever_their_slots_sit(perm_seed, capacity, per_head):
    """Tied scores (span pooling gives a span's tokens one score) are ranked by position, not by
    slot order: a row alone and the same row in a padded batch lay their slots out differently."""
    pos = torch.tensor([9, 4, 7, 2, 8, -1, 5])
    scores = torch.tensor([1.0, 1.0, 3.0, 1.0, 1.0, 9.0, 0.5])  # the empty slot's 9 never counts
    perm = torch.randperm(7, generator=torch.Generator().manual_seed(perm_seed))
    cache = SparseCache([capacity] if per_head else capacity)
    cache.allocate(1, 1, 1, torch.float32, torch.device("cpu"), False)
    k = pos[perm].float().view(1, 1, 7, 1)
    cache.select(KVBlock(k, k, pos[perm].view(1, 1, 7)), scores[perm].view(1, 1, 7), torch.tensor([True]))
    # by score, then older first: 7 (3.0), then the tied 2, 4, 8, 9
    assert sorted(p for p in cache.block.pos.flatten().tolist() if p >= 0) == sorted([7, 2, 4, 8, 9][:capacity])


def test_rows_not_at_a_step_are_unchanged():
    cache = SparseCache(1)
    cache.allocate(2, 1, 1, torch.float32, torch.device("cpu"), False)
    cache.block.pos[:] = torch.tensor([[[3]], [[4]]])
    cands = KVBlock(torch.zeros(2, 1, 2, 1), torch.zeros(2, 1, 2, 1), torch.tensor([[[8, 3]], [[9, 4]]]))
    evicted = cache.select(cands, torch.tensor([[[1.0, 0.0]], [[1.0, 0.0]]]), torch.tensor([True, False]))
    assert cache.block.pos[:, 0, 0].tolist() == [8, 4]
    assert evicted.pos[1].max() == -1 and sorted(evicted.pos[0, 0].tolist()) == [-1, 3]


def test_zero_capacity_evicts_everything():
    cache = SparseCache(0)
    cache.allocate(1, 1, 1, torch.float32, torch.device("cpu"), False)
    cands = KVBlock(torch.zeros(1, 1, 2, 1), torch.zeros(1, 1, 2, 1), torch.tensor([[[1, 2]]]))
    assert cache.select(cands, torch.zeros(1, 1, 2), torch.tensor([True])).valid.all()


def test_per_head_sizes_save_only_their_slots_and_count_what_they_hold():
    # The saved state is ragged (Σ λ_h slots a row); the live slots give every head max λ_h,
    # and nbytes counts what is held.
    cache = SparseCache([3, 0, 5])
    cache.allocate(2, 3, 4, torch.float32, torch.device("cpu"), False)
    state = cache.state_dict()
    assert state["k"].shape == (2, 1, 8, 4) and state["pos"].shape == (2, 1, 8)
    slots = {k: t for k, t in state.items() if k != "head_sizes"}
    assert sum(t.numel() * t.element_size() for t in slots.values()) == 2 * (2 * 8 * 4 * 4) + 2 * 8 * 8
    assert state["head_sizes"].tolist() == [[3, 0, 5]] * 2  # the layout, in head order, with every row
    assert cache.block.k.shape == (2, 3, 5, 4)
    assert cache.nbytes() == 2 * 3 * 5 * (2 * 4 * 4 + 8)


def test_per_head_sizes_keep_each_heads_own_top():
    sizes = [2, 0, 3]
    cache = SparseCache(sizes)
    cache.allocate(1, 3, 2, torch.float32, torch.device("cpu"), False)
    g = torch.Generator().manual_seed(0)
    n = 6
    pos = torch.arange(3 * n).view(1, 3, n)
    k = torch.randn(1, 3, n, 2, generator=g)
    scores = torch.randn(1, 3, n, generator=g)
    evicted = cache.select(KVBlock(k, k.clone(), pos), scores, torch.tensor([True]))
    for h, size in enumerate(sizes):
        expect = set(pos[0, h, scores[0, h].argsort(descending=True)[:size]].tolist())
        kept = {int(p) for p in cache.block.pos[0, h] if p >= 0}
        assert kept == expect, h
        assert {int(p) for p in evicted.pos[0, h] if p >= 0} == set(pos[0, h].tolist()) - expect
        for p in kept:  # each kept token's key travelled with it
            slot = int((cache.block.pos[0, h] == p).nonzero())
            assert torch.equal(cache.block.k[0, h, slot], k[0, h, p - h * n])


def test_per_head_sizes_state_round_trip_is_exact():
    cache = SparseCache([1, 3])
    cache.allocate(1, 2, 2, torch.float32, torch.device("cpu"), True)
    cands = KVBlock(torch.randn(1, 2, 4, 2), torch.randn(1, 2, 4, 2), torch.tensor([[[0, 1, 2, 3], [0, 1, 2, 3]]]), torch.rand(1, 2, 4))
    cache.select(cands, torch.rand(1, 2, 4), torch.tensor([True]))
    other = SparseCache([1, 3])
    other.load_state_dict(cache.state_dict())
    for a, b in zip(other.state_dict().values(), cache.state_dict().values()):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match=r"saved with per-head sizes \[1, 3\], but this layer holds \[2, 3\]"):
        SparseCache([2, 3]).load_state_dict(cache.state_dict())
