"""Hostile inputs, class 2 (state and cache integrity): a state no run could have written is
refused when it is loaded, naming the tensor.

The mechanism: :func:`lola.engine.composer.check_state`, run by ``LoLAMemory.load_state_dict`` (and so
by ``LoLACache.load``) for every state that comes from outside; rows reordered from a state
already in memory skip it.
"""

from __future__ import annotations

import pytest
import torch

import lola
from lola.layer import compose


def _state():
    attn = compose(lola.LoLAConfig(window=8, sparse_size=4, sinks=2, chunk=4), num_heads=4, head_dim=8, num_kv_heads=2)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 40, 4, 8, generator=g)
    state = attn.new_state()
    attn(x, x[:, :, :2], x[:, :, :2], state=state)
    return attn, state.state_dict()


def _damage(name):
    def nan(sd, key):
        sd[key] = sd[key].clone()
        sd[key].view(-1)[0] = float("nan")

    def inf(sd, key):
        sd[key] = sd[key].clone()
        sd[key].view(-1)[-1] = float("inf")

    return {"nan": nan, "inf": inf}[name]


FLOAT_KEYS = ["sinks.k", "sinks.v", "window.k", "window.v", "sparse.k", "sparse.v", "linear.H", "linear.s"]


@pytest.mark.parametrize("key", FLOAT_KEYS)
@pytest.mark.parametrize("kind", ["nan", "inf"])
def test_non_finite_values_are_refused_naming_the_tensor(key, kind):
    attn, sd = _state()
    _damage(kind)(sd, key)
    with pytest.raises(ValueError, match=rf"state\['{key}'\] holds non-finite values"):
        attn.new_state().load_state_dict(sd)


@pytest.mark.parametrize("key", ["sinks.pos", "window.pos", "sparse.pos"])
def test_a_position_beyond_seen_is_refused(key):
    attn, sd = _state()
    sd[key] = sd[key].clone()
    sd[key][0, 0, 0] = sd["seen"][0] + 5
    with pytest.raises(ValueError, match=rf"state\['{key}'\] holds a position at or beyond"):
        attn.new_state().load_state_dict(sd)


@pytest.mark.parametrize("source, target", [("sinks.pos", "sparse.pos"), ("window.pos", "sparse.pos"), ("sparse.pos", "sparse.pos")])
def test_a_position_held_twice_is_refused(source, target):
    attn, sd = _state()
    sd[target] = sd[target].clone()
    held = sd[source][0, 0][sd[source][0, 0] >= 0]
    slot = 1 if source == target else 0
    sd[target][0, 0, slot] = held[0]
    with pytest.raises(ValueError, match="a position is held twice"):
        attn.new_state().load_state_dict(sd)


def test_negative_seen_and_float_positions_are_refused():
    attn, sd = _state()
    bad = dict(sd, seen=-sd["seen"])
    with pytest.raises(ValueError, match="negative counts"):
        attn.new_state().load_state_dict(bad)
    bad = dict(sd, **{"window.pos": sd["window.pos"].float()})
    with pytest.raises(ValueError, match=r"state\['window.pos'\] must be .* integers"):
        attn.new_state().load_state_dict(bad)


def test_a_valid_state_loads_and_reproduces():
    attn, sd = _state()
    state = attn.new_state()
    state.load_state_dict(sd)
    loaded = state.state_dict()
    for k, t in loaded.items():
        if k.endswith((".k", ".v")):  # stored tokens bit-exact; empty slots are zeroed on load
            held = loaded[k.rsplit(".", 1)[0] + ".pos"] >= 0
            torch.testing.assert_close(t[held], sd[k][held], rtol=0, atol=0)
        else:
            torch.testing.assert_close(t, sd[k], rtol=0, atol=0)
    state.select_rows(torch.tensor([1, 0, 1]))  # reordering skips the check, and stays valid
    from lola.engine.composer import check_state

    check_state(state.state_dict())


def test_a_saved_cache_with_a_damaged_state_is_refused(tmp_path):
    """Through LoLACache.load, with the checksums recomputed (an edit, not damage)."""
    import json

    from safetensors.torch import load_file, save

    from lola.integrations.transformers import LoLACache, apply_lola
    from lola.integrations.transformers.cache import _meta_checksum
    from lola.models import tiny_random

    model, _ = tiny_random()
    apply_lola(model, lola.LoLAConfig(window=8, sparse_size=4, sinks=2))
    cache = LoLACache(model)
    with torch.no_grad():
        model(torch.randint(0, 100, (1, 30)), cache=cache)
    cache.save(tmp_path / "c")
    meta = json.loads((tmp_path / "c" / "cache.json").read_text())
    tensors = load_file(tmp_path / "c" / meta["tensors"])
    tensors["layers.0.linear.s"] = torch.full_like(tensors["layers.0.linear.s"], float("nan"))
    data = save(tensors)
    import hashlib

    (tmp_path / "c" / meta["tensors"]).write_bytes(data)
    meta["sha256"] = hashlib.sha256(data).hexdigest()
    meta["checksum"] = _meta_checksum(meta)
    (tmp_path / "c" / "cache.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"layer 0's state does not fit .*linear.s'\] holds non-finite values"):
        LoLACache.load(tmp_path / "c", model)


def test_a_policy_returning_nan_scores_is_refused():
    from dataclasses import dataclass

    from lola.policies import register, unregister

    @dataclass(frozen=True)
    class NanScores:
        needs_attention = False

        def score(self, candidates, ctx):
            return torch.full(candidates.pos.shape, float("nan"))

    register("nan_scores_test", NanScores)
    try:
        attn = compose(lola.LoLAConfig(window=8, sparse_size=4, sinks=2, chunk=4, policy="nan_scores_test"), num_heads=4, head_dim=8, num_kv_heads=2)
        x = torch.randn(1, 40, 4, 8)
        with pytest.raises(ValueError, match="returned NaN scores for"):
            attn(x, x[:, :, :2], x[:, :, :2])
    finally:
        unregister("nan_scores_test")


def test_a_forward_with_another_models_cache_is_refused():
    from lola.integrations.transformers import LoLACache, apply_lola
    from lola.models import tiny_random

    ids = torch.randint(0, 100, (1, 20))
    a, b = tiny_random()[0], tiny_random()[0]
    for m in (a, b):
        apply_lola(m, lola.LoLAConfig(window=8, sparse_size=4, sinks=2))
    cache = LoLACache(a)
    with torch.no_grad():
        a(ids, cache=cache)
        with pytest.raises(ValueError, match="another model's LoLACache"):
            b(ids[:, -1:], cache=cache)
        a(ids[:, -1:], cache=cache)  # its own model still extends it
