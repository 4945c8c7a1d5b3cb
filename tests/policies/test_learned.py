from dataclasses import dataclass

import pytest
import torch

import lola
from lola import models, policies
from lola.memory import KVBlock
from lola.policies import LearnedScore
from lola.scorers import TokenScorer
from tests.policies.test_builtin import ctx_for
from tests.scorers.test_scorers import hand_score


def scorer_file(tmp_path, layers=2, hs=1, d=3, seed=0, inv=None):
    g = torch.Generator().manual_seed(seed)
    s = TokenScorer(torch.randn(layers, hs, 2 * d + 1, generator=g), inv, {"model": "test"})
    path = tmp_path / f"s{seed}.safetensors"
    s.save(path)
    return s, str(path)


def test_learned_policy_scores_by_the_fitted_formula(tmp_path):
    inv = torch.tensor([1.0, 0.01])
    s, path = scorer_file(tmp_path, d=4, hs=2, inv=inv)
    policy = policies.build("learned", scorer=path)
    ctx, _ = ctx_for(h=2, d=4)
    ctx.layer = 1
    g = torch.Generator().manual_seed(5)
    cand = KVBlock(torch.randn(1, 2, 6, 4, generator=g), torch.randn(1, 2, 6, 4, generator=g), torch.randint(0, 500, (1, 2, 6), generator=g))
    torch.testing.assert_close(policy.score(cand, ctx).double(), hand_score(s.weight, inv, 1, cand.k, cand.v, cand.pos), atol=1e-4, rtol=1e-4)


def test_the_learned_policy_needs_a_layer_index_and_a_scorer(tmp_path):
    _, path = scorer_file(tmp_path)
    ctx, _ = ctx_for(h=1)
    cand = KVBlock(torch.randn(1, 1, 2, 3), torch.randn(1, 1, 2, 3), torch.arange(2).view(1, 1, 2))
    with pytest.raises(ValueError, match="needs the layer's index"):
        LearnedScore(path).score(cand, ctx)
    with pytest.raises(ValueError, match="scorer"):
        policies.build("learned")
    with pytest.raises(KeyError, match="no shipped scorer named 'nope'"):
        policies.build("learned", scorer="nope")


@dataclass(frozen=True)
class _UnrotatedReference:
    """The same linear score, with the rotation undone by transformers' own rotary module at −pos."""

    weight: torch.Tensor
    rotary: torch.nn.Module
    needs_attention = False

    def score(self, candidates, ctx):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        b, hs, n, d = candidates.k.shape
        neg = -candidates.pos.reshape(b * hs, n)
        cos, sin = self.rotary(candidates.k, neg)
        _, key = apply_rotary_pos_emb(candidates.k.reshape(b * hs, 1, n, d), candidates.k.reshape(b * hs, 1, n, d), cos, sin)
        feats = torch.cat([key.reshape(b, hs, n, d), candidates.v.float(), torch.ones(b, hs, n, 1)], dim=-1)
        return torch.einsum("bhnf,hf->bhn", feats, self.weight[ctx.layer])


def test_a_model_with_the_learned_policy_equals_the_same_score_written_by_hand(tmp_path):
    """End to end on a tiny model: the learned policy's selections match a policy computing the
    same score with transformers' rotary module (so the keys' positions line up) for every
    candidate at every step, where the learned policy scores each token once, as it leaves the
    window, and keeps the score; and they differ from SRE's."""
    model, tok = models.tiny_random()
    rotary = model.model.rotary_emb
    weight = torch.randn(2, 2, 33, generator=torch.Generator().manual_seed(1))
    path = tmp_path / "s.safetensors"
    TokenScorer(weight, rotary.inv_freq.clone()).save(path)
    ref = _UnrotatedReference(weight, rotary)
    policies.register("test_unrotated_reference", lambda: ref, overwrite=True)
    ids = torch.randint(1, 250, (2, 150), generator=torch.Generator().manual_seed(2))
    base = dict(window=8, sparse_size=8, sinks=2, chunk=8, mixing="softmax_only")
    try:
        out = {}
        for name, kw in {"learned": {"scorer": str(path)}, "test_unrotated_reference": {}, "sre": {}}.items():
            lola.apply_lola(model, lola.LoLAConfig(**base, policy=name, policy_kwargs=kw))
            with torch.no_grad():
                out[name] = model(ids).logits
            lola.remove_lola(model)
    finally:
        policies.unregister("test_unrotated_reference")
    torch.testing.assert_close(out["learned"], out["test_unrotated_reference"], atol=1e-4, rtol=1e-4)
    assert (out["learned"] - out["sre"]).abs().max() > 1e-3
