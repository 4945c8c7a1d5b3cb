from dataclasses import dataclass

import pytest
import torch

import lola
from lola import policies


@dataclass(frozen=True)
class ValueNorm:
    needs_attention = False

    def score(self, candidates, ctx):
        return candidates.v.float().norm(dim=-1)


def test_builtin_names():
    assert {"sre", "attention", "recency", "random", "key_norm"} <= set(policies.available())


def test_register_route_works_in_config_and_layer():
    policies.register("value_norm_test", ValueNorm)
    try:
        cfg = lola.LoLAConfig(policy="value_norm_test", window=2, sparse_size=2, sinks=0, chunk=2)
        attn = lola.compose(cfg, num_heads=1, head_dim=4)
        v = torch.randn(1, 12, 1, 4)
        _, state = attn(torch.randn(1, 12, 1, 4), torch.randn(1, 12, 1, 4), v)
        kept = [int(p) for p in state.sparse.block.pos[0, 0]]
        # the two largest-norm values among everything that left the window were kept
        left = sorted(set(range(12)) - {int(p) for p in state.window.block.pos[0, 0] if p >= 0})
        best = sorted(left, key=lambda j: -float(v[0, j, 0].norm()))[:2]
        assert sorted(kept) == sorted(best)
    finally:
        policies.unregister("value_norm_test")


def test_register_rejects_duplicates_and_non_policies():
    with pytest.raises(ValueError, match="already registered"):
        policies.register("sre", ValueNorm)
    with pytest.raises(TypeError, match="score"):
        policies.register("broken", object)


def test_entry_point_route(installed_plugin):
    # A fake installed distribution that publishes a policy through the entry-point group.
    source = """
        class KeyMean:
            needs_attention = False
            def score(self, candidates, ctx):
                return candidates.k.float().mean(dim=-1)
        """
    installed_plugin("thirdparty_policy", source, "lola.policies", "key_mean", "KeyMean")
    try:
        policies.reload_entry_points()
        assert "key_mean" in policies.available()
        cfg = lola.LoLAConfig(policy="key_mean", window=2, sparse_size=2, chunk=2)
        attn = lola.compose(cfg, num_heads=1, head_dim=4)
        o, _ = attn(torch.randn(1, 9, 1, 4), torch.randn(1, 9, 1, 4), torch.randn(1, 9, 1, 4))
        assert torch.isfinite(o).all()
    finally:
        policies.unregister("key_mean")
