"""The few-call CPU form of the decode step (lola.kernels.decoding.fused) against the reference:
every mixing rule, ragged runs, empty caches, huge logits and the share cap."""

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
