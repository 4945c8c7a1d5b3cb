"""The select-and-evict step (lola.engine.select_step): the window's oldest tokens and the sparse
cache compete, the top ``λ`` by the policy's score stay, every other token is folded, once."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lola
from lola.engine.select_step import _compaction, select
from lola.memory.blocks import EMPTY, KVBlock


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 3), hs=st.integers(1, 3), n=st.integers(0, 9), data=st.data())
def test_compact_keeps_every_token_in_the_width_of_the_fullest_head(b, hs, n, data):
    valid = torch.tensor(data.draw(st.lists(st.booleans(), min_size=b * hs * n, max_size=b * hs * n)), dtype=torch.bool).view(b, hs, n)
    pos = torch.where(valid, torch.arange(b * hs * n).view(b, hs, n), EMPTY)
    k = torch.randn(b, hs, n, 4)
    block = KVBlock(k, k + 1, pos, None)
    order = _compaction(block.valid)
    out = block if order is None else block.gather(order)
    e = int(valid.sum(-1).amax()) if valid.numel() else 0
    assert out.pos.shape == (b, hs, e)
    for i in range(b):
        for h in range(hs):
            kept = [int(p) for p in pos[i, h] if p >= 0]
            got = [int(p) for p in out.pos[i, h]]
            if e < n:  # moved: to the front, in slot order
                assert got[: len(kept)] == kept and all(p == EMPTY for p in got[len(kept) :])
            assert sorted(p for p in got if p >= 0) == kept
            for p in kept:  # each token's key and value travel with its position
                src, dst = int((pos[i, h] == p).nonzero()), int((out.pos[i, h] == p).nonzero())
                assert torch.equal(out.k[i, h, dst], k[i, h, src]) and torch.equal(out.v[i, h, dst], k[i, h, src] + 1)


def _state_between_steps(window, sparse, chunk, tokens, seed=0):
    """A recency-scored layer's state fed ``tokens`` tokens (its last step at the last multiple
    of ``chunk``; the tokens since wait in the window)."""
    cfg = lola.LoLAConfig(window=window, sparse_size=sparse, sinks=1, chunk=chunk, policy="recency")
    attn = lola.compose(cfg, num_heads=2, head_dim=8, num_kv_heads=1)
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, tokens, hh, 8, generator=g) for hh in (2, 1, 1))
    with torch.no_grad():
        _, state = attn(q, k, v)
    return attn, state


@pytest.mark.parametrize("extra", [0, 3])
def test_select_keeps_the_top_scores_and_returns_every_other_candidate_to_fold(extra):
    window, sparse, chunk = 4, 3, 6
    attn, state = _state_between_steps(window, sparse, chunk, tokens=1 + window + extra + 2)
    before_cache = sorted(int(p) for p in state.sparse.block.pos[0, 0] if p >= 0)
    before_window = sorted(int(p) for p in state.window.block.pos[0, 0] if p >= 0)
    with torch.no_grad():
        fk, v, mask, pos = select(state, torch.tensor([True]), attn.feature_map_k, attn.scale)
    after_cache = sorted(int(p) for p in state.sparse.block.pos[0, 0] if p >= 0)
    after_window = sorted(int(p) for p in state.window.block.pos[0, 0] if p >= 0)
    folded = sorted(int(p) for p in pos[0, 0][mask[0, 0]])
    leaving = sorted(set(before_window) - set(after_window))
    candidates = sorted(before_cache + leaving)
    # Recency: the newest λ candidates stay, the others are folded, each token exactly once.
    assert after_cache == candidates[-sparse:]
    assert folded == candidates[:-sparse]
    assert len(after_window) == window
    # Both query heads of the storage head fold the same tokens, with their own features.
    assert torch.equal(mask[0, 0], mask[0, 1]) and fk.shape[:3] == v.shape[:3] == mask.shape


@pytest.mark.parametrize("sparse_size", [3, (5, 1)])
@pytest.mark.parametrize("policy", ["sre", "recency", "at_exit", "distinct"])
def test_the_folded_tokens_features_are_those_of_their_keys(policy, sparse_size):
    """SRE computes every candidate's features and the fold takes the evicted ones' from them;
    recency computes none and the fold computes them; a policy that keeps its scores (``at_exit``)
    hands the step a rebuilt block over the same keys, and ``distinct`` wraps SRE: each way,
    uniform or per-head budgets, each folded token's features are the key feature map of its
    own key, for each query head."""
    sizes = dict(sparse_size=sparse_size) if isinstance(sparse_size, int) else dict(sparse_size_per_head=list(sparse_size))
    cfg = lola.LoLAConfig(window=4, sinks=1, chunk=6, policy=policy, **sizes)
    attn = lola.compose(cfg, num_heads=4, head_dim=8, num_kv_heads=2)
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(2, 11, 4, 8, generator=g), torch.randn(2, 11, 2, 8, generator=g), torch.randn(2, 11, 2, 8, generator=g)
    with torch.no_grad():
        _, state = attn(q, k, v)
        keys = {}  # position -> key, per (row, storage head)
        for m in state.exact_memories:
            b = m.block
            for i, h, j in (b.pos >= 0).nonzero().tolist():
                keys[(i, h, int(b.pos[i, h, j]))] = b.k[i, h, j].clone()  # (the slots are written in place)
        fk, _, mask, pos = select(state, torch.tensor([True, True]), attn.feature_map_k, attn.scale)
        assert mask.any()
        for i, qh, j in mask.nonzero().tolist():
            key = keys[(i, qh // 2, int(pos[i, qh, j]))]
            one = torch.zeros(1, 4, 1, 8)
            one[0, qh, 0] = key
            torch.testing.assert_close(fk[i, qh, j], attn.feature_map_k(one)[0, qh, 0], rtol=1e-5, atol=1e-6)


def test_select_leaves_rows_that_do_not_step_unchanged():
    cfg = lola.LoLAConfig(window=3, sparse_size=2, sinks=0, chunk=8, policy="recency")
    attn = lola.compose(cfg, num_heads=2, head_dim=8, num_kv_heads=1)
    q, k, v = torch.randn(2, 6, 2, 8), torch.randn(2, 6, 1, 8), torch.randn(2, 6, 1, 8)
    with torch.no_grad():
        _, state = attn(q, k, v)
        before = {name: t.clone() for name, t in state.state_dict().items()}
        _, _, mask, _ = select(state, torch.tensor([False, True]), attn.feature_map_k, attn.scale)
    after = state.state_dict()
    assert not mask[0].any() and mask[1].any()
    for name in ("sparse.pos", "window.pos"):
        assert torch.equal(after[name][0], before[name][0])
        assert not torch.equal(after[name][1], before[name][1])
