"""Hostile inputs, class 7 (degenerate or contradictory configs): refused where they are built,
not run to a result that looks like success.

- a storage head with no exact token under ``softmax_only`` (the rule reads exact tokens
  alone: its output would be zeros), per head and per layer of a model;
- ``full_attention_layers`` naming every layer (nothing would run LoLA);
- ``affine=True`` with a rule other than ``lolcats`` (which alone has an affine form);
- where the share cap starts (``linear_share_cap_from``) without a cap;
- non-finite feature-map parameters (refused when a sequence starts: every output would be NaN)
  and a Hedgehog floor ``eps`` that is not a finite positive number.
"""

from __future__ import annotations

import re

import pytest
import torch

import lola
from lola.integrations.transformers import apply_lola
from tests.integrations.transformers.conftest import tiny


@pytest.mark.parametrize(
    "fields, heads",
    [
        (dict(window=0, sparse_size=0, sinks=0), "[0, 1]"),
        (dict(window=0, sparse_size=0, sinks=0, schedule="tokenwise", chunk=1), "[0, 1]"),
        (dict(window_per_head=[0, 4], sparse_size_per_head=[0, 2], sinks=0), "[0]"),
    ],
)
def test_a_head_with_no_exact_token_is_refused_under_softmax_only(fields, heads):
    cfg = lola.LoLAConfig(mixing="softmax_only", **fields)
    with pytest.raises(ValueError, match=re.escape(f"storage heads {heads} hold no exact token")):
        lola.compose(cfg, num_heads=2, head_dim=4)
    # a rule that reads the linear state has something to read: pure linear attention is fine
    attn = lola.compose(cfg.model_copy(update={"mixing": "lola_authors"}), num_heads=2, head_dim=4)
    o, _ = attn(torch.randn(1, 6, 2, 4), torch.randn(1, 6, 2, 4), torch.randn(1, 6, 2, 4))
    assert o.abs().amax() > 0
    # one sink is enough
    lola.compose(cfg.model_copy(update={"sinks": 1}), num_heads=2, head_dim=4)


def test_a_model_layer_with_no_exact_token_is_named():
    cfg = lola.LoLAConfig(window=4, sparse_size=0, sinks=0, mixing="softmax_only", layer_overrides={1: {"window": 0}})
    with pytest.raises(ValueError, match="layer 1: storage heads"):
        apply_lola(tiny("llama"), cfg)


def test_full_attention_in_every_layer_is_refused():
    model = tiny("llama")
    layers = model.config.num_hidden_layers
    with pytest.raises(ValueError, match=f"covers every one of the model's {layers} layers"):
        apply_lola(model, lola.LoLAConfig(full_attention_layers=list(range(layers))))
    apply_lola(model, lola.LoLAConfig(full_attention_layers=list(range(layers - 1))))


@pytest.mark.parametrize("mixing", ["lola_authors", "softmax_only"])
def test_affine_with_a_rule_that_has_no_affine_form_is_refused(mixing):
    with pytest.raises(ValueError, match=f"affine=True weighs the linear term of the lolcats rule only, and mixing='{mixing}' ignores it"):
        lola.compose(lola.LoLAConfig(mixing=mixing, affine=True), num_heads=2, head_dim=4)
    lola.compose(lola.LoLAConfig(mixing="lolcats", affine=True), num_heads=2, head_dim=4)


def test_a_share_cap_start_without_a_cap_is_refused():
    with pytest.raises(ValueError, match="linear_share_cap_from=2048 says where the share cap starts, but linear_share_cap is None"):
        lola.LoLAConfig(mixing="lola_authors", linear_share_cap_from=2048)
    built = lola.compose(lola.LoLAConfig(mixing="lola_authors"), num_heads=2, head_dim=4)
    parts = dict(memory_factory=built.memory_factory, feature_map_q=built.feature_map_q, feature_map_k=built.feature_map_k)
    with pytest.raises(ValueError, match="share_cap_from=5 without a share_cap"):
        lola.LoLAAttention(2, 4, share_cap_from=5, **parts)
    lola.LoLAAttention(2, 4, share_cap=0.1, share_cap_from=5, **parts)  # with a cap: accepted


@pytest.mark.parametrize("name", ["feature_map_q.mlp.layer", "feature_map_k.mlp.layer", "window_factors"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_non_finite_parameters_are_refused_when_a_sequence_starts(name, value):
    attn = lola.compose(lola.LoLAConfig(feature_map="hedgehog", feature_dim=8), num_heads=2, head_dim=4)
    x = torch.randn(1, 6, 2, 4)
    attn(x, x, x)  # finite: runs
    with torch.no_grad():
        dict(attn.named_parameters())[name].view(-1)[0] = value
    state = attn.new_state()
    with pytest.raises(ValueError, match=re.escape(f"LoLA layer parameter(s) {name} hold non-finite values")):
        attn(x, x, x, state=state)
    assert not state.allocated


@pytest.mark.parametrize("eps", [0.0, -1e-6, float("nan"), float("inf"), "1e-6"])
def test_a_hedgehog_floor_that_is_not_finite_and_positive_is_refused(eps):
    from lola.feature_maps.hedgehog import HedgehogFeatureMap

    with pytest.raises(ValueError, match="eps must be a finite number > 0"):
        HedgehogFeatureMap(num_heads=2, head_dim=4, feature_dim=8, eps=eps)
