"""A layer's share of the heads (lola.head_share, compose(heads=...)): the shares a tensor-parallel
run splits a layer into, each built with its slice of the parameters, give the whole layer's
outputs side by side, through prefill and decode."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lola
from lola.head_share import head_axes, head_share
from tests.oracles import assert_rel_close
from tests.scorers.test_scorers import random_scorer
from tests.strategies import seeds

POLICIES = ["sre", "random", "recency", "attention", "expected_attention", "key_norm", "learned"]


def _scorer(tmp_path, layers, kv_heads, head_dim):
    path = tmp_path / f"scorer-{kv_heads}-{head_dim}.safetensors"
    if not path.exists():
        random_scorer(layers=layers, hs=kv_heads, d=head_dim).save(path)
    return str(path)


def _shares(cfg, h, hkv, d, splits, layer):
    """The whole layer (trained-looking random parameters) and its shares cut at ``splits``
    (query-head boundaries), each loaded with its slice of the whole layer's parameters."""
    whole = lola.compose(cfg, h, d, hkv, layer=layer)
    with torch.no_grad():
        for p in whole.parameters():
            p.add_(0.1 * torch.randn_like(p))
    axes = head_axes(whole)
    shares = []
    for first, end in zip(splits, splits[1:]):
        part = lola.compose(cfg, h, d, hkv, layer=layer, heads=(first, end))
        part.load_state_dict({n: t.narrow(axes[n], first, end - first) for n, t in whole.state_dict().items()})
        shares.append((first, end, part))
    return whole, shares


@settings(max_examples=25, deadline=None)
@given(
    groups=st.sampled_from([(2, 1), (2, 2), (3, 3), (1, 4)]),  # (query heads per K/V head, K/V heads)
    policy=st.sampled_from(POLICIES),
    per_head=st.booleans(),
    storage=st.sampled_from(["kv_head", "query_head"]),
    mixing=st.sampled_from(["lolcats", "lola_authors", "softmax_only"]),
    cut=st.data(),
    seed=seeds,
)
def test_the_shares_side_by_side_are_the_whole_layer(tmp_path_factory, groups, policy, per_head, storage, mixing, cut, seed):
    g, hkv = groups
    h, d, t = g * hkv, 8, 37
    if policy == "learned" and storage == "query_head":
        storage = "kv_head"  # a scorer scores K/V heads
    storage_heads = hkv if storage == "kv_head" else h
    # the K/V-head boundaries a run may cut at (whole groups), at least one cut inside the layer
    bounds = sorted(set(cut.draw(st.lists(st.integers(1, hkv - 1), max_size=hkv - 1)))) if hkv > 1 else []
    splits = [0, *[b * g for b in bounds], h]
    sizes = dict(window=5, sparse_size=4, sinks=1, chunk=3)
    if per_head:
        sizes["sparse_size_per_head"] = [1 + (3 * i) % 7 for i in range(storage_heads)]
    kwargs = {"scorer": _scorer(tmp_path_factory.mktemp("s"), 2, hkv, d)} if policy == "learned" else {}
    cfg = lola.LoLAConfig(policy=policy, policy_kwargs=kwargs, gqa_storage=storage, mixing=mixing, **sizes)
    torch.manual_seed(seed)
    whole, shares = _shares(cfg, h, hkv, d, splits, layer=1)
    q, k, v = torch.randn(2, t, h, d), torch.randn(2, t, hkv, d), torch.randn(2, t, hkv, d)
    with torch.no_grad():
        expected, state = whole(q[:, :30], k[:, :30], v[:, :30])
        expected_next, _ = whole(q[:, 30:], k[:, 30:], v[:, 30:], state=state)  # decode on, token by token in one call
        got, got_next = [], []
        for first, end, part in shares:
            kv = slice(first // g, end // g)
            o, s = part(q[:, :30, first:end], k[:, :30, kv], v[:, :30, kv])
            o2, _ = part(q[:, 30:, first:end], k[:, 30:, kv], v[:, 30:, kv], state=s)
            got.append(o)
            got_next.append(o2)
    assert_rel_close(expected, torch.cat(got, dim=2), 1e-5, "prefill")
    assert_rel_close(expected_next, torch.cat(got_next, dim=2), 1e-5, "continued")


def test_the_share_holds_its_heads_sizes_and_offset():
    cfg = lola.LoLAConfig(window=4, sparse_size=4, sparse_size_per_head=[1, 2, 3], sinks=1, chunk=2)
    part = lola.compose(cfg, 6, 8, 3, layer=0, heads=(2, 6))
    state = part.new_state()
    assert (part.num_heads, part.num_kv_heads) == (4, 2)
    assert state.sparse.head_sizes == [2, 3] and state.head_offset == 1
    assert lola.compose(cfg, 6, 8, 3, layer=0).new_state().head_offset is None
    assert part.feature_map_q.mlp.layer.shape[0] == 4 and part.window_factors.shape == (1, 4, 1, 1)


@pytest.mark.parametrize(
    "heads, match",
    [
        ((1, 4), "split a group of 2 query heads"),
        ((0, 7), "0 <= first < end <= num_heads"),
        ((2, 2), "0 <= first < end <= num_heads"),
        ([0, 2], "a pair of ints"),
        ((0, 2.0), "a pair of ints"),
    ],
)
def test_a_share_that_is_not_whole_groups_is_refused(heads, match):
    with pytest.raises((ValueError, TypeError), match=match):
        lola.compose(lola.LoLAConfig(), 6, 8, 3, heads=heads)


def test_a_policy_that_couples_the_heads_cannot_score_a_share():
    cfg = lola.LoLAConfig(policy="span", policy_kwargs={"policy": "sre", "across_heads": True})
    lola.compose(cfg, 4, 8, 2)  # the whole layer is fine
    with pytest.raises(ValueError, match="ranks the candidates of every head"):
        lola.compose(cfg, 4, 8, 2, heads=(0, 2))
    lola.compose(lola.LoLAConfig(policy="span", policy_kwargs={"policy": "sre"}), 4, 8, 2, heads=(0, 2))  # per head: fine


def test_head_axes_name_every_parameter_or_refuse():
    layer = lola.compose(lola.LoLAConfig(), 4, 8, 2)
    assert head_axes(layer) == {"window_factors": 1, "feature_map_q.mlp.layer": 0, "feature_map_k.mlp.layer": 0}
    layer.feature_map_q.extra = torch.nn.Parameter(torch.zeros(3))  # a parameter no map declared
    with pytest.raises(ValueError, match=r"feature_map_q.extra.*declare no head axis"):
        head_axes(layer)


def test_a_scorer_scores_a_share_with_its_heads_weights():
    s = random_scorer(layers=1, hs=3, d=4)
    g = torch.Generator().manual_seed(0)
    k, v, pos = torch.randn(1, 3, 5, 4, generator=g), torch.randn(1, 3, 5, 4, generator=g), torch.randint(0, 50, (1, 3, 5), generator=g)
    whole = s.score(0, k, v, pos)
    torch.testing.assert_close(s.score(0, k[:, 1:], v[:, 1:], pos[:, 1:], first_head=1), whole[:, 1:])
    with pytest.raises(ValueError, match="from head 2"):
        s.score(0, k[:, :2], v[:, :2], pos[:, :2], first_head=2)  # past the scorer's heads
    with pytest.raises(ValueError, match="3 K/V heads"):
        s.score(0, k[:, :2], v[:, :2], pos[:, :2])  # two heads given as the whole layer


def test_head_share_of_query_head_storage_keeps_query_heads():
    share = head_share((2, 4), 4, 2, "query_head")
    assert (share.storage_first, share.storage_end, share.kv_heads) == (2, 4, 1)
