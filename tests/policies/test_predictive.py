import math
from types import SimpleNamespace

import pytest
import torch

from lola.memory import KVBlock, QueryStatistics
from lola.policies import ExpectedAttention, KeyDiff, ScoringPolicy, average_rope_rotation
from tests.policies.test_builtin import ctx_for


def rope(x: torch.Tensor, position: float, theta: float) -> torch.Tensor:
    """transformers' Llama RoPE of one vector ``x [D]`` at ``position`` (rotate_half layout)."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.cat([position * inv, position * inv])
    rot = torch.cat([-x[d // 2 :], x[: d // 2]])
    return x * ang.cos() + rot * ang.sin()


def test_average_rotation_is_the_mean_of_rope_rotations():
    d, theta, n = 6, 100.0, 7
    eye = torch.eye(d, dtype=torch.float64)
    mean = sum(torch.stack([rope(eye[:, j], delta, theta) for j in range(d)], dim=1) for delta in range(1, n + 1)) / n
    torch.testing.assert_close(average_rope_rotation(d, theta, n).double(), mean, rtol=1e-5, atol=1e-6)


def expected_attention_oracle(k, v, valid, queries, scale, group, rot=None, value_norm=True):
    """Loops over heads and candidates; queries[h] is the list of query head h's queries."""
    b, hs, n, _ = k.shape
    out = torch.zeros(b, hs, n, dtype=torch.float64)
    for row in range(b):
        for s in range(hs):
            probs = []
            for qh in range(s * group, (s + 1) * group):
                qs = [q.double() for q in queries[row][qh]]
                w = [0.5 ** ((len(qs) - 1 - i) / 64.0) for i in range(len(qs))]
                mu = sum(wi * q for wi, q in zip(w, qs)) / sum(w)
                cov = sum(wi * torch.outer(q - mu, q - mu) for wi, q in zip(w, qs)) / sum(w)
                if rot is not None:
                    mu, cov = rot @ mu, rot @ cov @ rot.T
                a = [
                    float(scale * mu @ k[row, s, j].double() + 0.5 * scale**2 * k[row, s, j].double() @ cov @ k[row, s, j].double())
                    if valid[row, s, j]
                    else -math.inf
                    for j in range(n)
                ]
                m = max(a)
                e = [math.exp(x - m) if x > -math.inf else 0.0 for x in a]
                probs.append([x / sum(e) for x in e])
            for j in range(n):
                p = sum(pr[j] for pr in probs) / group
                out[row, s, j] = p * (float(v[row, s, j].double().norm()) if value_norm else 1.0)
    return out


@pytest.mark.parametrize("theta", [None, 50.0])
@pytest.mark.parametrize("value_norm", [True, False])
def test_expected_attention_matches_the_formula(theta, value_norm):
    g = torch.Generator().manual_seed(3)
    b, h, hs, n, d, t = 2, 4, 2, 6, 4, 9
    ctx, _ = ctx_for(h=h, d=d, b=b)
    ctx.scale = 0.5
    q = torch.randn(b, h, t, d, generator=g)
    ctx.queries = QueryStatistics(64.0)
    ctx.queries.allocate(b, h, d, torch.device("cpu"))
    ctx.queries.update(q, torch.ones(b, t, dtype=torch.bool))
    pos = torch.arange(n).expand(b, hs, n).clone()
    pos[0, 1, 2] = -1  # an empty slot gets nothing
    cand = KVBlock(torch.randn(b, hs, n, d, generator=g), torch.randn(b, hs, n, d, generator=g), pos)
    policy = ExpectedAttention(value_norm=value_norm, rope_theta=theta, horizon=5)
    assert isinstance(policy, ScoringPolicy) and policy.needs_queries
    out = policy.score(cand, ctx)
    rot = None if theta is None else average_rope_rotation(d, theta, 5).double()
    ref = expected_attention_oracle(cand.k, cand.v, cand.valid, [[list(q[r, x].unbind(0)) for x in range(h)] for r in range(b)], 0.5, h // hs, rot, value_norm)
    torch.testing.assert_close(torch.where(cand.valid, out, 0.0).double(), ref, rtol=1e-4, atol=1e-6)


def test_expected_attention_max_over_the_group():
    ctx, _ = ctx_for(h=2, d=3)
    ctx.queries = QueryStatistics()
    ctx.queries.allocate(1, 2, 3, torch.device("cpu"))
    ctx.queries.update(torch.randn(1, 2, 4, 3), torch.ones(1, 4, dtype=torch.bool))
    cand = KVBlock(torch.randn(1, 1, 5, 3), torch.ones(1, 1, 5, 3), torch.arange(5).view(1, 1, 5))
    per_head = [ExpectedAttention(value_norm=False).score(cand, _single_head(ctx, i)) for i in range(2)]
    torch.testing.assert_close(ExpectedAttention(value_norm=False, reduce="max").score(cand, ctx), torch.maximum(*per_head))
    with pytest.raises(ValueError, match="reduce"):
        ExpectedAttention(reduce="sum")


def _single_head(ctx, i):
    from lola.policies import ScoringContext

    stats = QueryStatistics()
    stats.load_state_dict({k: t[:, i : i + 1] for k, t in ctx.queries.state_dict().items()})
    return ScoringContext(ctx.linear, ctx.feature_map_k, 1, ctx.step, scale=ctx.scale, queries=stats)


def test_expected_attention_needs_statistics():
    ctx, _ = ctx_for()
    with pytest.raises(RuntimeError, match="query statistics"):
        ExpectedAttention().score(KVBlock(torch.zeros(1, 1, 2, 3), torch.zeros(1, 1, 2, 3), torch.zeros(1, 1, 2, dtype=torch.long)), ctx)


def test_key_diff_is_minus_cosine_to_the_mean_unit_key():
    k = torch.tensor([[[[1.0, 0.0], [0.0, 2.0], [3.0, 3.0], [9.0, -9.0]]]])
    pos = torch.tensor([[[0, 1, 2, -1]]])  # the last slot is empty: not part of the anchor
    out = KeyDiff().score(KVBlock(k, k, pos), SimpleNamespace(exact_keys=lambda block: block.k))  # absolute positions
    anchor = (torch.tensor([1.0, 0.0]) + torch.tensor([0.0, 1.0]) + torch.tensor([1.0, 1.0]) / math.sqrt(2)) / 3
    for j in range(3):
        expect = -float(k[0, 0, j] @ anchor / (k[0, 0, j].norm() * anchor.norm()))
        assert abs(float(out[0, 0, j]) - expect) < 1e-6
