import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lola import scorers
from lola.errors import UnknownName
from lola.scorers import TokenScorer, token_features, unrotate_keys


def rotary(d: int, theta: float = 10000.0):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = LlamaConfig(hidden_size=4 * d, num_attention_heads=4, rope_theta=theta, max_position_embeddings=8192)
    return LlamaRotaryEmbedding(cfg)


@settings(max_examples=25, deadline=None)
@given(positions=st.lists(st.integers(0, 8191), min_size=1, max_size=8), seed=st.integers(0, 2**16))
def test_unrotate_keys_inverts_transformers_rotary_embedding(positions, seed):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    d = 16
    emb = rotary(d)
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(1, 2, len(positions), d, generator=g)
    pos = torch.tensor([positions])
    cos, sin = emb(k, pos)
    _, k_rot = apply_rotary_pos_emb(k, k, cos, sin)
    back = unrotate_keys(k_rot, pos[:, None].expand(1, 2, -1), emb.inv_freq)
    torch.testing.assert_close(back, k, atol=2e-4, rtol=1e-4)


def hand_score(weight, inv_freq, layer, k, v, pos):
    """Loops: rotate every (i, i + D/2) pair of each key by −pos·ω_i, dot with the weights."""
    b, hs, n, d = k.shape
    out = torch.zeros(b, hs, n, dtype=torch.float64)
    for r in range(b):
        for h in range(hs):
            w = weight[layer, h].double()
            for j in range(n):
                key = k[r, h, j].double().clone()
                x = key.clone()
                for i in range(d // 2):
                    a = -float(pos[r, h, j]) * float(inv_freq[i])
                    x[i] = key[i] * math.cos(a) - key[i + d // 2] * math.sin(a)
                    x[i + d // 2] = key[i + d // 2] * math.cos(a) + key[i] * math.sin(a)
                feats = torch.cat([x, v[r, h, j].double(), torch.ones(1, dtype=torch.float64)])
                out[r, h, j] = feats @ w
    return out


def random_scorer(layers=2, hs=2, d=4, seed=0, rope=True):
    g = torch.Generator().manual_seed(seed)
    inv = 100.0 ** (-torch.arange(0, d, 2).float() / d) if rope else None
    return TokenScorer(torch.randn(layers, hs, 2 * d + 1, generator=g), inv, {"model": "test"})


@pytest.mark.parametrize("rope", [True, False])
def test_score_matches_the_formula(rope):
    s = random_scorer(rope=rope)
    g = torch.Generator().manual_seed(1)
    k, v = torch.randn(2, 2, 5, 4, generator=g), torch.randn(2, 2, 5, 4, generator=g)
    pos = torch.randint(0, 3000, (2, 2, 5), generator=g)
    inv = s.inv_freq if rope else torch.zeros(2)
    torch.testing.assert_close(s.score(1, k, v, pos).double(), hand_score(s.weight, inv, 1, k, v, pos), atol=1e-4, rtol=1e-4)


def test_features_are_unrotated_key_value_and_one():
    k, v = torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    f = token_features(k, v, torch.zeros(1, 1, 3, dtype=torch.long), torch.ones(2))
    torch.testing.assert_close(f, torch.cat([k, v, torch.ones(1, 1, 3, 1)], dim=-1))


def test_a_token_scores_the_same_wherever_it_sits():
    """The rotary embedding is undone: the same content at two positions gets one score."""
    d = 16
    emb = rotary(d)
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    s = TokenScorer(torch.randn(1, 1, 2 * d + 1), emb.inv_freq.clone())
    k, v = torch.randn(1, 1, 1, d).expand(1, 1, 2, d), torch.randn(1, 1, 1, d).expand(1, 1, 2, d)
    pos = torch.tensor([[5, 4000]])
    cos, sin = emb(k[:, 0], pos)
    _, k_rot = apply_rotary_pos_emb(k, k, cos, sin)
    score = s.score(0, k_rot, v, pos[:, None])
    torch.testing.assert_close(score[..., 0], score[..., 1], atol=1e-3, rtol=1e-4)


def test_save_load_round_trip_and_is_scorer_file(tmp_path):
    s = random_scorer()
    path = tmp_path / "s.safetensors"
    s.save(path)
    back = scorers.load(path)
    torch.testing.assert_close(back.weight, s.weight)
    torch.testing.assert_close(back.inv_freq, s.inv_freq)
    assert back.info == {"model": "test"} and scorers.is_scorer_file(path)
    other = tmp_path / "other.safetensors"
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, str(other))
    assert not scorers.is_scorer_file(other)
    with pytest.raises(ValueError, match="not a token scorer file"):
        scorers.load(other)
    with pytest.raises(ValueError, match="was not written by lola fit-scorer"):
        s.save(other)  # a foreign file is never replaced


def test_a_changed_file_is_read_again(tmp_path):
    path = tmp_path / "s.safetensors"
    random_scorer(seed=0).save(path)
    first = scorers.load(path)
    random_scorer(seed=1, layers=3).save(path)
    assert scorers.load(path).num_layers == 3 and first.num_layers == 2


def test_unknown_names_and_bad_types_are_refused():
    with pytest.raises(UnknownName, match="no shipped scorer named 'nope'"):
        scorers.load("nope")
    with pytest.raises(TypeError, match="shipped name or a path"):
        scorers.load(3)


@pytest.mark.parametrize(
    "weight,inv,match",
    [
        (torch.zeros(2, 2, 8), None, r"2 \* head_dim \+ 1"),
        (torch.zeros(2, 9), None, "layers, kv_heads"),
        (torch.full((1, 1, 9), float("nan")), None, "finite"),
        (torch.zeros(1, 1, 9), torch.ones(3), "inv_freq must be"),
    ],
)
def test_malformed_scorers_are_refused(weight, inv, match):
    with pytest.raises(ValueError, match=match):
        TokenScorer(weight, inv)


def test_geometry_mismatch_names_both():
    s = random_scorer()
    s.check_geometry(2, 2, 4)
    with pytest.raises(ValueError, match=r"2 layers x 2 K/V heads x head_dim 4 \(fitted on test\).*3 x 2 x 4"):
        s.check_geometry(3, 2, 4)
    with pytest.raises(ValueError, match="outside the scorer's 2 layers"):
        s.score(2, torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="gqa_storage='kv_head'"):
        s.score(0, torch.zeros(1, 4, 1, 4), torch.zeros(1, 4, 1, 4), torch.zeros(1, 4, 1, dtype=torch.long))


@pytest.mark.parametrize("name", sorted(scorers.SHIPPED))
def test_shipped_scorers_load_and_are_checked(name, monkeypatch):
    s = scorers.load(name)
    assert s.info["model"] in name and "report" in s.info
    scorers._LOADED.clear()
    monkeypatch.setitem(scorers.SHIPPED, name, "0" * 64)
    with pytest.raises(ValueError, match="is damaged"):
        scorers.load(name)
    scorers._LOADED.clear()


def test_every_shipped_file_is_registered():
    from importlib import resources

    files = sorted(p.name[: -len(".safetensors")] for p in resources.files("lola.scorers").iterdir() if p.name.endswith(".safetensors"))
    assert files == scorers.available()
