"""The fused CPU form of the softmax partials (lola.kernels.exact_attention.fused) against the
reference: the same softmax (``num / den`` and ``den · e^max``), another shift allowed."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lola.kernels as K
from lola.kernels.exact_attention import fused
from lola.kernels.exact_attention import reference as ref

from ..strategies import ragged_offsets
from .helpers import assert_close_rel, make_ragged
from .test_exact_attention import make_inputs


def _canonical(num, den, mx):
    """What a shift-free reader sees: the output ``num / den`` (0 where nothing is visible),
    the log-mass ``max + log den`` (``-inf`` there) and which rows saw a key."""
    seen = den > 0
    out = torch.where(seen[..., None], num / torch.where(seen, den, 1.0)[..., None], 0.0)
    mass = torch.where(seen, mx + torch.log(torch.where(seen, den, 1.0)), -math.inf)
    return out, mass, seen


def _assert_same_softmax(want, got):
    w, g = _canonical(*want), _canonical(*got)
    assert torch.equal(w[2], g[2]), "rows that see a key differ"
    assert_close_rel(w[0], g[0], 1e-5, "num / den")
    assert_close_rel(w[1], g[1], 1e-5, "max + log den")
    assert got[0].dtype == got[1].dtype == got[2].dtype == torch.float32


@settings(max_examples=30, deadline=None)
@given(
    L=st.sampled_from([1, 5, 16, 40]),
    N=st.integers(0, 70),
    G=st.integers(1, 3),
    Hs=st.integers(1, 3),
    empty=st.floats(0, 1),
    ragged=st.booleans(),
    data=st.data(),
    seed=st.integers(0, 2**16),
)
def test_property_fused_partials_are_the_reference_softmax(L, N, G, Hs, empty, ragged, data, seed):
    q, k, v, q_pos, k_pos = make_inputs(2, G * Hs, Hs, L, N, 16, empty_frac=empty, seed=seed)
    run = make_ragged(2, data.draw(ragged_offsets(heads=Hs, longest=30)), 16, max_pos=2 * N + 2, seed=seed) if ragged else None
    if run is not None and len(run.offsets) != Hs + 1:
        run = None
    want = ref.softmax_partial(q, k, v, q_pos, k_pos, 0.25, run)
    got = fused.softmax_partial(q, k, v, q_pos, k_pos, 0.25, run)
    _assert_same_softmax(want, got)


def test_rows_that_see_nothing_read_as_the_reference_s():
    q, k, v, _, k_pos = make_inputs(1, 4, 2, 20, 30, 8)
    k_pos = torch.full_like(k_pos, -1)
    k_pos[:, :, 3] = 10
    q_pos = torch.arange(20)[None] - 5  # positions -5 .. 14: the first 15 rows see nothing
    num, den, mx = fused.softmax_partial(q, k, v, q_pos, k_pos, 0.5)
    assert (num[:, :, :15] == 0).all() and (den[:, :, :15] == 0).all() and (mx[:, :, :15] == -math.inf).all()
    _assert_same_softmax(ref.softmax_partial(q, k, v, q_pos, k_pos, 0.5), (num, den, mx))


def test_the_fused_form_runs_only_where_the_caller_allows_it():
    q, k, v, q_pos, k_pos = make_inputs(1, 4, 2, 20, 30, 8)
    with K.record_calls() as calls:
        exact = K.softmax_partial(q, k, v, q_pos, k_pos, 0.5)
        shifted = K.softmax_partial(q, k, v, q_pos, k_pos, 0.5, exact_max=False)
        with K.use_backend("reference"):
            K.softmax_partial(q, k, v, q_pos, k_pos, 0.5, exact_max=False)
    assert calls == {("softmax_partial", "reference"): 2, ("softmax_partial", "fused"): 1}
    assert torch.equal(exact[2], ref.softmax_partial(q, k, v, q_pos, k_pos, 0.5)[2])  # the largest score, as defined
    _assert_same_softmax(exact, shifted)
    q.requires_grad_(True)
    with K.record_calls() as calls:
        K.softmax_partial(q, k, v, q_pos, k_pos, 0.5, exact_max=False)
    assert calls == {("softmax_partial", "reference"): 1}  # autograd: the reference's backward
