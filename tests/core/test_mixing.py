import pytest
import torch

from lola.core import LinearPartial, SoftmaxPartial, mix
from lola.memory import KVBlock, QueryBlock, exact_logits, partial_from_logits


def partials(scale_logits: float):
    g = torch.Generator().manual_seed(0)
    b, h, l, n, d = 2, 3, 4, 6, 5
    q = torch.randn(b, h, l, d, generator=g) * scale_logits
    k = torch.randn(b, h, n, d, generator=g)
    v = torch.randn(b, h, n, d, generator=g)
    qb = QueryBlock(q, q, torch.full((b, l), 10), 1.0)
    exact = partial_from_logits(exact_logits(qb, KVBlock(k, v, torch.arange(n).expand(b, h, n))), v)
    lin = LinearPartial(torch.rand(b, h, l, d, generator=g), torch.rand(b, h, l, generator=g) + 0.5)
    return exact, lin


@pytest.mark.parametrize("rule", ["lolcats", "lola_authors", "softmax_only"])
@pytest.mark.parametrize("magnitude", [1.0, 1e3, 1e4])
def test_rules_are_finite_for_logits_up_to_1e4(rule, magnitude):
    exact, lin = partials(magnitude)
    assert exact.max.abs().max() > magnitude / 10  # logits really are large
    exact_neg = SoftmaxPartial(exact.num, exact.den, -exact.max.abs())  # very negative maxima
    for e in (exact, exact_neg):
        out = mix(e, lin, torch.full((3,), 0.3), rule)
        assert torch.isfinite(out).all()


def test_lolcats_formula():
    exact, lin = partials(1.0)
    w = torch.tensor([0.1, 0.5, 0.9])
    out = mix(exact, lin, w, "lolcats")
    wv = w.view(1, 3, 1)
    ref = (wv.unsqueeze(-1) * exact.num + lin.num) / (wv * exact.den + lin.den).unsqueeze(-1)
    torch.testing.assert_close(out, ref)
    out_aff = mix(exact, lin, w, "lolcats", affine=True)
    ref_aff = (wv.unsqueeze(-1) * exact.num + (1 - wv).unsqueeze(-1) * lin.num) / (wv * exact.den + (1 - wv) * lin.den).unsqueeze(-1)
    torch.testing.assert_close(out_aff, ref_aff)


def test_lola_authors_uses_unshifted_sums():
    exact, lin = partials(1.0)
    w = torch.tensor([0.2, 0.5, 0.7]).view(1, 3, 1)
    e = torch.exp(exact.max.double())
    ref = (w.unsqueeze(-1) * (e.unsqueeze(-1) * exact.num) + (1 - w).unsqueeze(-1) * lin.num) / (w * e * exact.den + (1 - w) * lin.den).unsqueeze(-1)
    torch.testing.assert_close(mix(exact, lin, w.view(-1), "lola_authors").double(), ref, rtol=1e-5, atol=1e-6)


def test_softmax_only_ignores_linear_and_empty_gives_zero():
    exact, lin = partials(1.0)
    torch.testing.assert_close(mix(exact, lin, torch.full((3,), 0.4), "softmax_only"), exact.num / exact.den.unsqueeze(-1))
    empty = SoftmaxPartial.empty(2, 3, 4, 5, torch.device("cpu"))
    zero_lin = LinearPartial(torch.zeros(2, 3, 4, 5), torch.zeros(2, 3, 4))
    for rule in ("lolcats", "lola_authors", "softmax_only"):
        assert torch.all(mix(empty, zero_lin, torch.full((3,), 0.4), rule) == 0)


@pytest.mark.parametrize("rule,affine", [("lolcats", False), ("lolcats", True), ("lola_authors", False), ("softmax_only", False)])
@pytest.mark.parametrize("magnitude", [0.3, 1.0, 30.0])
def test_every_output_is_the_linear_share_between_its_two_reads(rule, affine, magnitude):
    """mix = α · L.num/L.den + (1 − α) · E.num/E.den with α = linear_share: each rule is a convex
    combination of the state's read and the exact tokens' softmax."""
    from lola.core import linear_share

    exact, lin = partials(magnitude)
    w = torch.tensor([0.1, 0.5, 0.9])
    alpha = linear_share(exact, lin, w, rule, affine)
    assert alpha.shape == exact.den.shape and bool(((alpha >= 0) & (alpha <= 1)).all())
    read_state = lin.num / lin.den.unsqueeze(-1)
    read_exact = exact.num / exact.den.unsqueeze(-1)
    combined = alpha.unsqueeze(-1) * read_state + (1 - alpha.unsqueeze(-1)) * read_exact
    torch.testing.assert_close(mix(exact, lin, w, rule, affine), combined, rtol=1e-4, atol=1e-5)


def test_linear_share_by_hand():
    from lola.core import linear_share

    exact, lin = partials(1.0)
    w = torch.tensor([0.2, 0.5, 0.7])
    wv = w.view(1, 3, 1).double()
    e_den, l_den = exact.den.double(), lin.den.double()
    lolcats = l_den / (wv * e_den + l_den)
    authors = (1 - wv) * l_den / (wv * torch.exp(exact.max.double()) * e_den + (1 - wv) * l_den)
    torch.testing.assert_close(linear_share(exact, lin, w, "lolcats").double(), lolcats, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(linear_share(exact, lin, w, "lola_authors").double(), authors, rtol=1e-5, atol=1e-7)
    assert torch.all(linear_share(exact, lin, w, "softmax_only") == 0)
    empty = SoftmaxPartial.empty(2, 3, 4, 5, torch.device("cpu"))  # nothing exact, a state: all linear
    assert torch.all(linear_share(empty, lin, w, "lola_authors") == 1) and torch.all(linear_share(empty, lin, w, "lolcats") == 1)
