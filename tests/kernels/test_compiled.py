"""``LOLA_KERNELS=compiled``: the fused CPU forms under torch.compile against the reference, and
where the dispatcher takes them. Shapes stay off the sizes 0 and 1, which torch.compile
specialises, so the examples share a few graphs (each graph compiles for tens of seconds)."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lola.kernels as K
from lola.kernels.decoding import compiled
from lola.kernels.decoding import reference as decode_ref
from lola.kernels.exact_attention import reference as exact_ref

from ..strategies import seeds
from .helpers import assert_close_rel, make_ragged
from .test_decoding import make_inputs as decode_inputs
from .test_exact_attention import make_inputs as exact_inputs
from .test_exact_attention_fused import _assert_same_softmax


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@settings(max_examples=12, deadline=None)
@given(
    B=st.integers(2, 3),
    G=st.integers(2, 3),
    Hs=st.integers(2, 3),
    N=st.integers(2, 40),
    widths=st.lists(st.integers(2, 30), min_size=3, max_size=3),
    empty=st.floats(0, 0.9),
    cap=st.booleans(),
    seed=seeds,
)
def test_property_compiled_decode_is_the_reference(B, G, Hs, N, widths, empty, cap, seed):
    x = decode_inputs(B, G * Hs, Hs, N, 16, 8, empty_frac=empty, seed=seed)
    offsets = tuple(sum(widths[:i]) for i in range(Hs + 1))
    run = make_ragged(B, offsets, 16, empty_frac=empty, seed=seed + 1)
    share_cap = torch.linspace(0.05, 1.0, B) if cap else None
    want = decode_ref.decode_step(**x, mixing="lola_authors", scale=0.25, ragged=run, share_cap=share_cap)
    got = compiled.decode_step(**x, mixing="lola_authors", scale=0.25, ragged=run, share_cap=share_cap)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert_close_rel(want, got, 1e-5)


def test_the_prefills_reads_run_their_fused_form_uncompiled():
    q, k, v, q_pos, k_pos = exact_inputs(2, 6, 2, 40, 30, 16, empty_frac=0.3, seed=5)
    run = make_ragged(2, (0, 12, 31), 16, max_pos=62, seed=6)
    with K.use_backend("compiled"), K.record_calls() as calls:
        got = K.softmax_partial(q, k, v, q_pos, k_pos, 0.25, ragged=run, exact_max=False)
    assert calls == {("softmax_partial", "fused"): 1}
    _assert_same_softmax(exact_ref.softmax_partial(q, k, v, q_pos, k_pos, 0.25, run), got)


def test_the_compiled_backend_compiles_the_fused_form_on_a_cpu_only():
    x = decode_inputs(2, 6, 3, 9, 16, 8, seed=1)
    before = _graphs()
    with K.use_backend("compiled"), K.record_calls() as calls:
        got = K.decode_step(**x, mixing="lolcats", scale=0.5)
    assert calls == {("decode_step", "compiled"): 1}
    assert _graphs() > before, "nothing was compiled: the call ran eagerly"
    assert_close_rel(decode_ref.decode_step(**x, mixing="lolcats", scale=0.5), got, 1e-5)
    x["q"].requires_grad_(True)
    with K.use_backend("compiled"), K.record_calls() as calls:
        K.decode_step(**x, mixing="lolcats", scale=0.5)
    assert calls == {("decode_step", "reference"): 1}  # autograd: the reference
    with K.use_backend("compiled"), K.record_calls() as calls:
        K.self_recall_error(torch.rand(1, 2, 5, 4), torch.randn(1, 2, 5, 3), torch.rand(1, 2, 4, 3), torch.rand(1, 2, 4))
    assert calls == {("self_recall_error", "reference"): 1}  # no fused form: the reference
