import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lola.core import SoftmaxPartial, merge_softmax_partials
from lola.memory import KVBlock, QueryBlock, exact_logits, partial_from_logits
from tests.oracles import assert_rel_close


@settings(max_examples=30)
@given(n=st.integers(1, 30), cut=st.data(), seed=st.integers(0, 999))
def test_merging_partials_of_a_split_equals_one_partial(n, cut, seed):
    g = torch.Generator().manual_seed(seed)
    b, h, l, d = 2, 3, 4, 5
    q = torch.randn(b, h, l, d, generator=g)
    k, v = torch.randn(b, h, n, d, generator=g), torch.randn(b, h, n, d, generator=g)
    pos = torch.randint(-1, 6, (b, h, n), generator=g)
    qb = QueryBlock(q, q, torch.randint(0, 6, (b, l), generator=g), 0.7)
    whole = partial_from_logits(exact_logits(qb, KVBlock(k, v, pos)), v)
    c = cut.draw(st.integers(0, n))
    parts = [partial_from_logits(exact_logits(qb, KVBlock(k[:, :, a:z], v[:, :, a:z], pos[:, :, a:z])), v[:, :, a:z]) for a, z in ((0, c), (c, n))]
    merged = merge_softmax_partials(parts)
    out = merged.num / merged.den.clamp_min(1e-30).unsqueeze(-1)
    ref = whole.num / whole.den.clamp_min(1e-30).unsqueeze(-1)
    assert_rel_close(ref, out, 1e-6)
    assert torch.equal(torch.isfinite(merged.max), torch.isfinite(whole.max))


def test_empty_partial_is_neutral_and_nan_free():
    e = SoftmaxPartial.empty(1, 2, 3, 4, torch.device("cpu"))
    both = e.merge(e)
    assert torch.all(both.den == 0) and torch.all(both.num == 0) and not torch.isnan(both.max).any()


def test_partial_is_safe_for_huge_logits():
    q = torch.full((1, 1, 1, 2), 100.0)
    k = torch.tensor([[[[100.0, 0.0], [-100.0, 0.0]]]])
    v = torch.randn(1, 1, 2, 2)
    qb = QueryBlock(q, q, torch.tensor([[5]]), 1.0)  # logits ±1e4
    p = partial_from_logits(exact_logits(qb, KVBlock(k, v, torch.tensor([[[0, 1]]]))), v)
    assert torch.isfinite(p.num).all() and torch.isfinite(p.den).all()
    assert_rel_close(v[0, 0, 0], (p.num / p.den.unsqueeze(-1))[0, 0, 0], 1e-6)


def test_a_memory_with_no_slots_gives_the_empty_partial():
    q = torch.randn(1, 4, 3, 8)
    block = KVBlock(torch.zeros(1, 2, 0, 8), torch.zeros(1, 2, 0, 8), torch.zeros(1, 2, 0, dtype=torch.long))
    p = partial_from_logits(exact_logits(QueryBlock(q, q, torch.zeros(1, 3, dtype=torch.long), 1.0), block), block.v)
    assert p.num.shape == (1, 4, 3, 8) and torch.all(p.den == 0) and torch.all(p.max == float("-inf"))
