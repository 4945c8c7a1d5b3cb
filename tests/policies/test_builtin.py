import pytest
import torch

import lola
from lola.memory import KVBlock, LinearState
from lola.policies import AttentionMagnitude, KeyNorm, Random, Recency, ScoringContext, ScoringPolicy, SelfRecallError


def ctx_for(h=2, f=4, d=3, b=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    lin = LinearState()
    lin.allocate(b, h, f, d, torch.device("cpu"))
    lin.H += torch.randn(b, h, f, d, generator=g)
    lin.s += torch.rand(b, h, f, generator=g) + 0.1
    W = torch.randn(h, d, f, generator=g)
    fmap = lambda x: torch.einsum("bhnd,hdf->bhnf", x, W).softmax(-1)  # noqa: E731
    return ScoringContext(lin, fmap, h, torch.zeros(b, dtype=torch.long)), W


def block(b=1, hs=1, n=5, d=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    return KVBlock(
        torch.randn(b, hs, n, d, generator=g),
        torch.randn(b, hs, n, d, generator=g),
        torch.arange(n).expand(b, hs, n).clone(),
        torch.rand(b, hs, n, generator=g),
    )


def test_all_builtins_satisfy_the_protocol():
    for p in (SelfRecallError(), AttentionMagnitude(), Recency(), Random(1), KeyNorm()):
        assert isinstance(p, ScoringPolicy)


def test_sre_matches_the_formula_and_averages_a_group():
    ctx, W = ctx_for(h=2)
    cand = block(hs=1)
    out = SelfRecallError().score(cand, ctx)
    assert out.shape == (1, 1, 5)
    errs = []
    for h in range(2):
        fk = torch.einsum("nd,df->nf", cand.k[0, 0], W[h]).softmax(-1)
        vhat = (fk @ ctx.linear.H[0, h]) / (fk @ ctx.linear.s[0, h] + 1e-6).unsqueeze(-1)
        errs.append((cand.v[0, 0] - vhat).norm(dim=-1))
    torch.testing.assert_close(out[0, 0], (errs[0] + errs[1]) / 2)


@pytest.mark.parametrize("reduce", ["mean", "max"])
def test_relative_sre_is_each_query_heads_error_over_the_value_norm(reduce):
    ctx, W = ctx_for(h=2)
    cand = block(hs=1)
    per_head = []
    for h in range(2):
        fk = torch.einsum("nd,df->nf", cand.k[0, 0], W[h]).softmax(-1)
        vhat = (fk @ ctx.linear.H[0, h]) / (fk @ ctx.linear.s[0, h] + 1e-6).unsqueeze(-1)
        per_head.append((cand.v[0, 0] - vhat).norm(dim=-1) / (cand.v[0, 0].norm(dim=-1) + 1e-6))
    want = (per_head[0] + per_head[1]) / 2 if reduce == "mean" else torch.maximum(per_head[0], per_head[1])
    torch.testing.assert_close(SelfRecallError(relative=True, reduce=reduce).score(cand, ctx)[0, 0], want)
    # an empty state loses every pair whole: relative error 1 for every token
    ctx.linear.H.zero_()
    ctx.linear.s.zero_()
    torch.testing.assert_close(SelfRecallError(relative=True).score(cand, ctx), torch.ones(1, 1, 5), atol=1e-5, rtol=0)


def test_sre_of_an_empty_state_is_the_value_norm():
    ctx, _ = ctx_for()
    ctx.linear.H.zero_()
    ctx.linear.s.zero_()
    cand = block(hs=2)
    torch.testing.assert_close(SelfRecallError().score(cand, ctx), cand.v.norm(dim=-1))


def test_simple_policies():
    ctx, _ = ctx_for()
    cand = block()
    assert torch.equal(Recency().score(cand, ctx), cand.pos.float())
    torch.testing.assert_close(KeyNorm().score(cand, ctx), cand.k.norm(dim=-1))
    torch.testing.assert_close(KeyNorm(largest=False).score(cand, ctx), -cand.k.norm(dim=-1))
    assert torch.equal(AttentionMagnitude().score(cand, ctx), cand.acc)


def test_random_is_seeded_and_split_invariant():
    ctx, _ = ctx_for()
    cand = block(n=64)
    a, b = Random(1).score(cand, ctx), Random(1).score(cand, ctx)
    assert torch.equal(a, b)
    assert not torch.equal(a, Random(2).score(cand, ctx))
    assert ((a >= 0) & (a < 1)).all() and a.std() > 0.1
    # a token's score depends on its position, not its slot
    perm = torch.randperm(64)
    shuffled = KVBlock(cand.k[:, :, perm], cand.v[:, :, perm], cand.pos[:, :, perm])
    assert torch.equal(Random(1).score(shuffled, ctx), a[:, :, perm])


def test_attention_magnitude_accumulates_attention_received():
    torch.manual_seed(0)
    cfg = lola.LoLAConfig(window=4, sparse_size=4, sinks=0, chunk=100, policy="attention")
    attn = lola.compose(cfg, num_heads=2, head_dim=4, num_kv_heads=1)
    q, k, v = torch.randn(1, 6, 2, 4), torch.randn(1, 6, 1, 4), torch.randn(1, 6, 1, 4)
    _, state = attn(q, k, v)  # no step yet: all 6 tokens in the window
    s = torch.einsum("bihd,bjhd->bhij", q, k.expand(1, 6, 2, 4)) * attn.scale
    p = s.masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
    expected = p.sum(dim=(1, 2))[0]  # summed over query heads and queries
    blk = state.window.block
    got = {int(pos): float(a) for pos, a in zip(blk.pos[0, 0], blk.acc[0, 0]) if pos >= 0}
    for j in range(6):
        assert abs(got[j] - float(expected[j])) < 1e-5


def test_attention_mass_is_counted_once_per_query_across_steps():
    # Nothing reaches the linear state (budget >= T) but steps move tokens window -> sparse:
    # each query spreads a mass of 1 per query head over its exact set, so the tallies sum
    # to T x (query heads per storage head), whether a step fell on the query or not.
    torch.manual_seed(1)
    cfg = lola.LoLAConfig(window=3, sparse_size=20, sinks=1, chunk=2, policy="attention")
    attn = lola.compose(cfg, num_heads=4, head_dim=4, num_kv_heads=2)
    t = 17
    q, k, v = torch.randn(1, t, 4, 4), torch.randn(1, t, 2, 4), torch.randn(1, t, 2, 4)
    for split in ([t], [1] * t, [5, 1, 1, 10]):
        state, start = None, 0
        for n in split:
            _, state = attn(q[:, start : start + n], k[:, start : start + n], v[:, start : start + n], state=state)
            start += n
        total = sum(float(m.block.acc[m.block.pos >= 0].sum()) for m in state.exact_memories if m.capacity)
        assert abs(total - t * 2 * 2) < 1e-4, split
