"""The training-form hybrid equals the LoLA layer it trains (window + linear, Tokenwise)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lola
from lola.linearize import hybrid_attention


def layer_and_hybrid(T, W, H, Hkv, D, mixing, affine, seed):
    torch.manual_seed(seed)
    affine = affine and mixing == "lolcats"  # the other rules have no affine form (refused)
    cfg = lola.LoLAConfig(window=W, sparse_size=0, sinks=0, schedule="tokenwise", mixing=mixing, affine=affine, feature_map="hedgehog", feature_dim=5)
    layer = lola.compose(cfg, num_heads=H, head_dim=D, num_kv_heads=Hkv)
    with torch.no_grad():
        layer.window_factors.normal_(0, 2)
    q, k, v = torch.randn(2, T, H, D), torch.randn(2, T, Hkv, D), torch.randn(2, T, Hkv, D)
    with torch.no_grad():
        expected, _ = layer(q, k, v)
        qh = q.transpose(1, 2)
        kh, vh = (x.transpose(1, 2).repeat_interleave(H // Hkv, dim=1) for x in (k, v))
        gate = torch.sigmoid(layer.window_factors).view(-1)
        got = hybrid_attention(qh, kh, vh, layer.feature_map_q(qh), layer.feature_map_k(kh), gate, W, layer.scale, mixing, affine)
    return expected, got.transpose(1, 2)


@settings(max_examples=25, deadline=None)
@given(
    T=st.integers(1, 90),
    W=st.integers(1, 20),
    heads=st.sampled_from([(2, 2), (4, 2), (3, 1)]),
    mixing=st.sampled_from(["lolcats", "lola_authors", "softmax_only"]),
    affine=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_hybrid_equals_the_layer(T, W, heads, mixing, affine, seed):
    expected, got = layer_and_hybrid(T, W, heads[0], heads[1], 8, mixing, affine, seed)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_window_longer_than_the_sequence_is_plain_softmax():
    T, H, D = 10, 2, 4
    q, k, v = torch.randn(1, H, T, D), torch.randn(1, H, T, D), torch.randn(1, H, T, D)
    f = torch.rand(1, H, T, 3)
    got = hybrid_attention(q, k, v, f, f, torch.full((H,), 0.3), window=32, scale=0.5, mixing="lolcats")
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_gradients_reach_the_feature_maps():
    layer = lola.compose(lola.LoLAConfig(window=4, sparse_size=0, sinks=0, feature_map="hedgehog", feature_dim=4), num_heads=2, head_dim=4)
    q, k, v = torch.randn(1, 2, 20, 4), torch.randn(1, 2, 20, 4), torch.randn(1, 2, 20, 4)
    y = hybrid_attention(q, k, v, layer.feature_map_q(q), layer.feature_map_k(k), torch.sigmoid(layer.window_factors).view(-1), 4, 0.5)
    y.square().sum().backward()
    for p in (layer.feature_map_q.mlp.layer, layer.feature_map_k.mlp.layer, layer.window_factors):
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_bad_window_is_refused():
    x = torch.randn(1, 1, 3, 2)
    with pytest.raises(ValueError, match="window"):
        hybrid_attention(x, x, x, x.abs(), x.abs(), torch.ones(1), 0, 1.0)
