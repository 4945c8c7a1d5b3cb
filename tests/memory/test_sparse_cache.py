import torch

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
