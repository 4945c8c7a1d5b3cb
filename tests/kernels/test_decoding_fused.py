"""The few-call forms of lola.kernels.decoding.fused against the reference: the decode step
(every mixing rule, ragged runs, empty caches, huge logits, the share cap) and the prefill's
mix of partials."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lola.kernels as K
from lola.kernels.decoding import fused
from lola.kernels.decoding import reference as ref

from ..strategies import ragged_offsets, seeds
from .helpers import DTYPES, assert_close_rel, make_ragged, tolerance
from .test_decoding import RULES, make_inputs


def _cap(B, draw_cap, mixing):
    if not draw_cap or mixing == "softmax_only":
        return None
    return torch.tensor([0.05, 1.0, 0.3][:B])


@settings(max_examples=40, deadline=None)
@given(
    mixing=st.sampled_from(RULES),
    B=st.integers(1, 3),
    G=st.integers(1, 3),
    Hs=st.integers(1, 3),
    N=st.integers(0, 40),
    dtype=st.sampled_from(DTYPES),
    empty=st.floats(0, 1),
    ragged=st.booleans(),
    cap=st.booleans(),
    small_gate=st.booleans(),
    data=st.data(),
    seed=seeds,
)
def test_property_fused_decode_is_the_reference(mixing, B, G, Hs, N, dtype, empty, ragged, cap, small_gate, data, seed):
    x = make_inputs(B, G * Hs, Hs, N, 16, 8, dtype, empty_frac=empty, seed=seed)
    if small_gate:
        x["gate"] = torch.full_like(x["gate"], 0.02)  # the state's share is large: a cap binds
    run = make_ragged(B, data.draw(ragged_offsets(heads=Hs, longest=40)), 16, dtype, empty_frac=empty, seed=seed + 1) if ragged else None
    if run is not None and len(run.offsets) != Hs + 1:
        run = None
    share_cap = _cap(B, cap, mixing)
    want = ref.decode_step(**x, mixing=mixing, scale=0.25, ragged=run, share_cap=share_cap)
    got = fused.decode_step(**x, mixing=mixing, scale=0.25, ragged=run, share_cap=share_cap)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert_close_rel(want, got, tolerance(dtype))


@pytest.mark.parametrize("mixing", RULES)
def test_empty_caches_and_huge_logits(mixing):
    x = make_inputs(2, 6, 2, 30, 16, 8, empty_frac=0.0)
    x["k_pos"][0] = -1  # row 0: nothing exact visible
    x["q"] = x["q"] * 2000.0  # row 1: logits ~1e4
    run = make_ragged(2, (0, 7, 12), 16, torch.float32, empty_frac=0.0, seed=3)
    run.pos[0] = -1
    cap = None if mixing == "softmax_only" else torch.tensor([0.1, 0.1])
    want = ref.decode_step(**x, mixing=mixing, scale=0.25, ragged=run, share_cap=cap)
    got = fused.decode_step(**x, mixing=mixing, scale=0.25, ragged=run, share_cap=cap)
    assert torch.isfinite(got).all()
    assert_close_rel(want, got, 1e-4)


def test_the_public_op_takes_the_fused_form_on_a_cpu_only_under_auto():
    x = make_inputs(1, 4, 2, 9, 8, 4)
    with K.record_calls() as calls:
        auto = K.decode_step(**x, mixing="lola_authors", scale=0.5)
        with K.use_backend("reference"):
            defined = K.decode_step(**x, mixing="lola_authors", scale=0.5)
    assert calls == {("decode_step", "fused"): 1, ("decode_step", "reference"): 1}
    assert_close_rel(defined, auto, 1e-5)
    x["q"].requires_grad_(True)
    with K.record_calls() as calls:
        K.decode_step(**x, mixing="lola_authors", scale=0.5)
    assert calls == {("decode_step", "reference"): 1}  # autograd: the reference


def _partials(B, H, L, D, seed, no_exact, no_state):
    """Partials as the reads give them: a query that sees nothing has ``E_num = E_den = 0`` and
    ``e_max = -inf``; an empty state has ``L_num = L_den = 0``."""
    g = torch.Generator().manual_seed(seed)
    e_num = torch.randn(B, H, L, D, generator=g)
    e_den = torch.rand(B, H, L, generator=g) * 4 + 0.05
    e_max = torch.randn(B, H, L, generator=g) * 3
    l_num = torch.randn(B, H, L, D, generator=g) * 5
    l_den = torch.rand(B, H, L, generator=g) * 8 + 0.05
    blind = torch.rand(B, H, L, generator=g) < no_exact
    e_num[blind], e_den[blind], e_max[blind] = 0.0, 0.0, float("-inf")
    empty = torch.rand(B, H, L, generator=g) < no_state
    l_num[empty], l_den[empty] = 0.0, 0.0
    return e_num, e_den, e_max, l_num, l_den


@settings(max_examples=60, deadline=None)
@given(
    mixing=st.sampled_from(RULES),
    B=st.integers(1, 3),
    H=st.integers(1, 4),
    L=st.integers(1, 20),
    no_exact=st.sampled_from([0.0, 0.3, 1.0]),
    no_state=st.sampled_from([0.0, 0.3, 1.0]),
    cap=st.sampled_from(["none", "number", "per_output", "per_row"]),
    seed=seeds,
)
def test_property_fused_mix_is_the_reference(mixing, B, H, L, no_exact, no_state, cap, seed):
    e_num, e_den, e_max, l_num, l_den = _partials(B, H, L, 8, seed, no_exact, no_state)
    gate = torch.rand(H, generator=torch.Generator().manual_seed(seed + 1))
    share_cap = None
    if mixing != "softmax_only" and cap == "number":
        share_cap = 0.2
    elif mixing != "softmax_only" and cap == "per_output":  # [B, 1, L], as the layer's caps by position
        share_cap = torch.rand(B, 1, e_den.shape[-1], generator=torch.Generator().manual_seed(seed + 2)).clamp_min(0.01)
        share_cap[..., ::3] = 1.0  # 1: no cap
    elif mixing != "softmax_only" and cap == "per_row":
        share_cap = torch.rand(B, 1, 1, generator=torch.Generator().manual_seed(seed + 2)).clamp_min(0.01)
    want = ref.mix_partials(e_num, e_den, e_max, l_num, l_den, gate, mixing, share_cap)
    got = fused.mix_partials(e_num, e_den, e_max, l_num, l_den, gate, mixing, share_cap)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert torch.isfinite(got).all()
    assert_close_rel(want, got, 1e-5)


def test_fused_mix_caps_where_the_reference_caps():
    # One output whose state share is 0.9, capped at 0.25: the capped mix, not the plain one.
    e_num, l_num = torch.ones(1, 1, 1, 2), torch.full((1, 1, 1, 2), 5.0)
    e_den, l_den, e_max, gate = torch.ones(1, 1, 1), torch.ones(1, 1, 1), torch.zeros(1, 1, 1), torch.tensor([0.1])
    got = fused.mix_partials(e_num, e_den, e_max, l_num, l_den, gate, "lolcats_affine", 0.25)
    torch.testing.assert_close(got, torch.full((1, 1, 1, 2), 0.75 * 1.0 + 0.25 * 5.0))
    plain = fused.mix_partials(e_num, e_den, e_max, l_num, l_den, gate, "lolcats_affine")
    torch.testing.assert_close(plain, torch.full((1, 1, 1, 2), 0.1 * 1.0 + 0.9 * 5.0))


def test_the_public_mix_takes_the_fused_form_without_gradients(monkeypatch):
    e_num, e_den, e_max, l_num, l_den = _partials(2, 3, 5, 4, 0, 0.2, 0.2)
    gate = torch.rand(3)
    calls = []
    real = fused.mix_partials
    monkeypatch.setattr(fused, "mix_partials", lambda *a: calls.append(1) or real(*a))
    auto = K.mix_partials(e_num, e_den, e_max, l_num, l_den, gate, "lola_authors", 0.5)
    assert calls == [1]
    with K.use_backend("reference"):
        defined = K.mix_partials(e_num, e_den, e_max, l_num, l_den, gate, "lola_authors", 0.5)
    assert calls == [1]
    assert_close_rel(defined, auto, 1e-5)
    # autograd: the definition (finite gradients where a denominator is 0)
    l_num.requires_grad_(True)
    out = K.mix_partials(e_num, e_den, e_max, l_num, l_den, gate, "lola_authors", 0.5)
    assert calls == [1]
    out.sum().backward()
    assert torch.isfinite(l_num.grad).all()
    with pytest.raises(ValueError, match="mixing must be one of"):
        K.mix_partials(e_num, e_den, e_max, l_num, l_den, gate, "nope")
