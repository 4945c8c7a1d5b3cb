"""A layer's state (lola.engine.state): rows are sequence slots that can be written, selected
and reordered."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lola


def _inputs(b, t, h, hkv, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, t, h, d, generator=g), torch.randn(b, t, hkv, d, generator=g), torch.randn(b, t, hkv, d, generator=g)


def test_rows_are_sequence_slots():
    """Two sequences prefilled alone and written into slots of one batched state decode as they
    would alone (what a serving engine does with a pool of slots)."""
    cfg = lola.LoLAConfig(window=6, sparse_size=4, sinks=2, chunk=4, mixing="lolcats")
    torch.manual_seed(0)
    attn = lola.compose(cfg, num_heads=4, head_dim=8, num_kv_heads=2)
    a, b = _inputs(1, 30, 4, 2, 8, seed=1), _inputs(1, 25, 4, 2, 8, seed=2)
    _, sa = attn(*(x[:, :21] for x in a))
    _, sb = attn(*(x[:, :13] for x in b))  # a different length: the rows are out of step
    pool = attn.new_state()
    pool.allocate(3, 4, 2, 8, attn.feature_dim, torch.float32, torch.device("cpu"))
    pool.write_rows(torch.tensor([2]), sa)
    pool.write_rows(torch.tensor([0]), sb)
    pool.select_rows(torch.tensor([2, 0]))  # drop the unused slot: row 0 = a, row 1 = b
    for i in range(8):
        step = [x[:, 21 + i : 22 + i] for x in a], [x[:, 13 + i : 14 + i] for x in b]
        o_pool, _ = attn(*(torch.cat([u, w]) for u, w in zip(*step)), state=pool)
        o_a, _ = attn(*step[0], state=sa)
        o_b, _ = attn(*step[1], state=sb)
        torch.testing.assert_close(o_pool, torch.cat([o_a, o_b]))
    with pytest.raises(ValueError, match="one row per row of other"):
        pool.write_rows(torch.tensor([0, 1]), sa)


def test_gqa_storage_is_the_configs_name_and_the_old_one_still_works():
    from lola.memory import SlidingWindow, SparseCache
    from lola.policies import Recency
    from lola.schedules import Chunkwise

    def parts():
        return dict(window=SlidingWindow(4, max_pending=2), sparse=SparseCache(2), policy=Recency(), schedule=Chunkwise(2))

    memory = lola.LoLAMemory(**parts(), gqa_storage="query_head")
    assert memory.gqa_storage == "query_head" and memory.spec()["gqa_storage"] == "query_head"
    with pytest.warns(DeprecationWarning, match="gqa_storage"):
        old = lola.LoLAMemory(**parts(), storage="query_head")
    assert old.gqa_storage == "query_head"
    with pytest.warns(DeprecationWarning, match="gqa_storage"):
        assert old.storage == "query_head"
    with pytest.raises(ValueError, match="gqa_storage must be 'kv_head' or 'query_head'"):
        lola.LoLAMemory(**parts(), gqa_storage="head")


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 9), min_size=3, max_size=3),
    policy=st.sampled_from(["sre", "recency", "attention", "at_exit"]),
    batch=st.integers(1, 3),
    query=st.booleans(),
)
def test_the_bytes_held_are_the_bytes_saved(sizes, policy, batch, query):
    """A layer holds what its state_dict saves, byte for byte, with per-head sparse sizes (held
    ragged, no head padded to the largest) and with the tallies a policy keeps; and the same
    total of sparse slots costs the uniform layer's bytes however it is spread over the heads."""
    from hypothesis import assume

    assume(sum(sizes) % 3 == 0)

    def state(sparse):
        memory = lola.LoLAMemory(
            window=lola.memory.SlidingWindow(4, max_pending=4),
            sparse=lola.memory.SparseCache(sparse),
            policy=lola.policies.build(policy),
            schedule=lola.schedules.build("chunkwise", chunk=4),
            sinks=lola.memory.SinkTokens(2),
            gqa_storage="query_head" if query else "kv_head",
        )
        storage = 6 if query else 3
        memory.allocate(batch, 6, storage, 8, 16, torch.float32, torch.device("cpu"))
        return memory

    per_head = sizes * 2 if query else sizes
    ragged = state(per_head)
    saved = sum(t.nbytes for k, t in ragged.state_dict().items() if not k.endswith(".head_sizes") and k != "layout")  # the layout is no slot
    assert ragged.nbytes() == saved
    assert saved == state(sum(per_head) // len(per_head)).nbytes()
