"""A segment's reads (lola.engine.segment_reads): one read per state the queries see, and reads
deferred and batched equal to reads one by one."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lola
from lola import kernels as K


def _inputs(b, t, h, hkv, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, t, h, d, generator=g), torch.randn(b, t, hkv, d, generator=g), torch.randn(b, t, hkv, d, generator=g)


def test_prefill_scores_per_step_and_reads_each_state_once():
    cfg = lola.LoLAConfig(window=8, sparse_size=4, sinks=2, chunk=8, policy="sre")
    attn = lola.compose(cfg, num_heads=4, head_dim=16, num_kv_heads=2)
    q, k, v = _inputs(2, 40, 4, 2, 16)
    with K.record_calls() as calls:
        attn(q, k, v)
    ops = {op: n for (op, _), n in calls.items()}
    # Five blocks, each ending at a step: one scoring per step; the six states the queries see
    # (one per block, and the last step's for the last query) are read one by one on a CPU.
    assert ops == {"self_recall_error": 40 // 8, "softmax_partial": 6}


@pytest.mark.parametrize("mixing", ["softmax_only", "lola_authors"])
@pytest.mark.parametrize("padded", [False, True], ids=["uniform rows", "padded rows"])
def test_prefill_reads_deferred_and_batched_equal_reads_one_by_one(monkeypatch, padded, mixing):
    """With a snapshot budget the groups' reads wait and run as one batched call (the path
    accelerators take); one by one (a CPU's) they give the same partials, padded rows too. The
    snapshots survive the writes that follow them (the slots' and, when the output reads it,
    the linear state's: both write in place otherwise)."""
    import lola.engine.segment_reads as reads

    cfg = lola.LoLAConfig(window=8, sparse_size=4, sinks=2, chunk=8, policy="sre", mixing=mixing)
    q, k, v = _inputs(2, 40, 4, 2, 16)
    mask = torch.ones(2, 40, dtype=torch.bool)
    if padded:
        mask[0, :5] = False  # left padding: the rows step at other packed indices
        mask[1, 33:] = False
    outs = []
    for budget in (2**30, 0):
        monkeypatch.setattr(reads, "READ_BYTES_CPU", budget)
        attn = lola.compose(cfg, num_heads=4, head_dim=16, num_kv_heads=2)
        with K.record_calls() as calls, torch.no_grad():  # (under autograd every write copies)
            outs.append(attn(q, k, v, padding_mask=mask if padded else None)[0])
        ops = {op: n for (op, _), n in calls.items()}
        if not padded:
            # One call for the six groups (the first block's, one per later block with the query
            # the previous step fell on, the last step's query), or one call per group.
            assert ops["softmax_partial"] == (1 if budget else 6)
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-6)


@settings(max_examples=15, deadline=None)
@given(
    mixing=st.sampled_from(["lola_authors", "softmax_only", "lolcats"]),
    chunk=st.sampled_from([16, 32]),
    t=st.integers(17, 90),
    budgets=st.booleans(),
    seed=st.integers(0, 3),
)
def test_a_prefill_read_by_fused_attention_is_the_reference_read(mixing, chunk, t, budgets, seed):
    """On a CPU the rules that read the exact part as num/den and den·e^max only (lola_authors,
    softmax_only) take fused attention for blocks of many queries: the layer's output is the
    reference backend's; lolcats, which reads the largest score, never takes it."""
    sizes = {"sparse_size_per_head": [3, 9]} if budgets else {}
    cfg = lola.LoLAConfig(window=8, sparse_size=6, sinks=2, chunk=chunk, mixing=mixing, feature_map="hedgehog", feature_dim=8, **sizes)
    torch.manual_seed(seed)
    attn = lola.compose(cfg, num_heads=4, head_dim=8, num_kv_heads=2)
    g = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(2, t, 4, 8, generator=g), torch.randn(2, t, 2, 8, generator=g), torch.randn(2, t, 2, 8, generator=g)
    with torch.no_grad(), K.record_calls() as calls:
        out, _ = attn(q, k, v)
        with K.use_backend("reference"):
            want, _ = attn(q, k, v)
    fused = calls[("softmax_partial", "fused")]
    assert (fused > 0) == (mixing != "lolcats"), calls
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
