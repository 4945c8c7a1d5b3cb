import pytest
import torch

import lola
from lola.memory import KVBlock
from lola.policies import Fusion, KeyNorm, Recency, SpanPooling, ValueWeighted, zscore
from tests.policies.test_builtin import ctx_for


def cand_block(pos, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    pos = torch.tensor(pos)
    return KVBlock(torch.randn(*pos.shape, d, generator=g), torch.randn(*pos.shape, d, generator=g), pos)


def test_zscore_ignores_empty_slots():
    x = torch.tensor([[[1.0, 2.0, 3.0, 100.0]]])
    valid = torch.tensor([[[True, True, True, False]]])
    z = zscore(x, valid)
    sd = (2 / 3) ** 0.5
    torch.testing.assert_close(z, torch.tensor([[[-1 / sd, 0.0, 1 / sd, 0.0]]]))


def test_fusion_is_the_weighted_sum_of_standardised_scores():
    cand = cand_block([[[5, 1, 9, 3, -1]]])
    ctx, _ = ctx_for(h=1, d=2)
    fused = Fusion(policies=["recency", "key_norm"], weights=[2.0, -1.0]).score(cand, ctx)
    for j in range(4):
        rec = [5.0, 1.0, 9.0, 3.0]
        norms = [float(cand.k[0, 0, i].norm()) for i in range(4)]

        def z(xs, i):
            m = sum(xs) / 4
            sd = (sum((x - m) ** 2 for x in xs) / 4) ** 0.5
            return (xs[i] - m) / sd

        assert abs(float(fused[0, 0, j]) - (2 * z(rec, j) - z(norms, j))) < 1e-5
    with pytest.raises(ValueError, match="weights"):
        Fusion(policies=["sre"], weights=[1.0, 2.0])
    with pytest.raises(KeyError, match="unknown policy"):
        Fusion(policies=["nope"])


def test_fusion_asks_for_what_its_parts_need():
    assert Fusion(policies=["sre", "expected_attention"]).needs_queries
    assert not Fusion(policies=["sre", "recency"]).needs_queries
    assert Fusion(policies=["attention", "recency"]).needs_attention


def test_value_weighted_multiplies_by_the_value_norm():
    cand = cand_block([[[0, 1, 2]]])
    out = ValueWeighted(policy="key_norm").score(cand, None)
    torch.testing.assert_close(out, KeyNorm().score(cand, None) * cand.v.norm(dim=-1))


def test_span_pooling_takes_the_max_over_nearby_positions():
    pos = [[[10, 11, 12, 30, 13, -1], [10, 20, 21, 22, 40, 41]]]
    cand = cand_block(pos)
    inner = Recency().score(cand, None)
    out = SpanPooling(policy="recency", radius=1).score(cand, None)
    for h in range(2):
        for j, p in enumerate(pos[0][h]):
            if p < 0:
                continue
            near = [float(inner[0, h, i]) for i, q in enumerate(pos[0][h]) if q >= 0 and abs(q - p) <= 1]
            assert float(out[0, h, j]) == max(near)


def test_span_pooling_across_heads_shares_spans():
    pos = [[[10, 50], [11, 60]]]
    cand = cand_block(pos)
    out = SpanPooling(policy="recency", radius=1, across_heads=True).score(cand, None)
    z = zscore(Recency().score(cand, None), cand.valid)
    # position 10 (head 0) sees 11 of head 1: both get the larger of their standardised scores
    assert float(out[0, 0, 0]) == pytest.approx(max(float(z[0, 0, 0]), float(z[0, 1, 0])))
    assert float(out[0, 1, 0]) == pytest.approx(max(float(z[0, 0, 0]), float(z[0, 1, 0])))
    assert float(out[0, 0, 1]) == pytest.approx(float(z[0, 0, 1]))


def test_combinators_are_configurable_by_name():
    cfg = lola.LoLAConfig(
        window=2, sparse_size=3, chunk=2, policy="span", policy_kwargs={"policy": "fusion", "policy_kwargs": {"policies": ["sre", "expected_attention"]}}
    )
    attn = lola.compose(cfg, num_heads=2, head_dim=4)
    o, state = attn(torch.randn(1, 12, 2, 4), torch.randn(1, 12, 2, 4), torch.randn(1, 12, 2, 4))
    assert torch.isfinite(o).all() and state.queries is not None
