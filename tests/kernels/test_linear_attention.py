import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lola.kernels as K
from lola.kernels.linear_attention import reference as ref

from .helpers import DTYPES, assert_outputs_close, tolerance, triton_impl

SIZES_T = [1, 63, 65, 200]
SIZES_FD = [(64, 60), (128, 64)]
OUTPUTS = ("num", "den", "H_T", "s_T")


def flat(out):
    """``(num, den, (H_T, s_T))`` as ``(num, den, H_T, s_T)``."""
    num, den, (h, s) = out
    return num, den, h, s


def make_inputs(B, T, H, F, D, dtype=torch.float32, device="cpu", state=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    # positive features, as produced by LoLA's feature maps
    fq = torch.rand(B, T, H, F, generator=g) / F
    fk = torch.rand(B, T, H, F, generator=g)
    v = torch.randn(B, T, H, D, generator=g)
    init = None
    if state:
        init = (torch.randn(B, H, F, D, generator=g), torch.rand(B, H, F, generator=g) * 10)
        init = tuple(x.to(device) for x in init)
    return fq.to(device, dtype), fk.to(device, dtype), v.to(device, dtype), init


# ---------------------------------------------------------------- reference identities


@pytest.mark.parametrize("T", SIZES_T)
@pytest.mark.parametrize("F,D", SIZES_FD)
@pytest.mark.parametrize("state", [False, True])
def test_chunked_matches_naive(T, F, D, state):
    fq, fk, v, init = make_inputs(2, T, 2, F, D, state=state)
    got = ref.chunk_linear_attention(fq, fk, v, init, output_final_state=True)
    naive = ref.naive_recurrent_linear_attention(fq, fk, v, init, output_final_state=True)
    num, den, (h, s) = got
    assert num.dtype == den.dtype == h.dtype == s.dtype == torch.float32
    assert num.shape == (2, T, 2, D) and den.shape == (2, T, 2)
    assert_outputs_close(flat(naive), flat(got), 1e-5, OUTPUTS)


@settings(max_examples=8, deadline=None)
@given(
    T=st.integers(1, 150),
    H=st.integers(1, 3),
    F=st.sampled_from([4, 16, 33]),
    D=st.sampled_from([3, 8, 17]),
    chunk=st.sampled_from([16, 64]),
    state=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_property_chunked_equals_naive(T, H, F, D, chunk, state, seed):
    fq, fk, v, init = make_inputs(1, T, H, F, D, state=state, seed=seed)
    got = ref.chunk_linear_attention(fq, fk, v, init, chunk_size=chunk)
    naive = ref.naive_recurrent_linear_attention(fq, fk, v, init)
    assert_outputs_close(naive[:2], got[:2], 1e-5, OUTPUTS)


def split_and_resume(fn, fq, fk, v, init, t1):
    a = fn(fq[:, :t1], fk[:, :t1], v[:, :t1], init, True)
    b = fn(fq[:, t1:], fk[:, t1:], v[:, t1:], a[2], True)
    return torch.cat([a[0], b[0]], 1), torch.cat([a[1], b[1]], 1), b[2]


@settings(max_examples=8, deadline=None)
@given(T=st.integers(2, 200), frac=st.floats(0.01, 0.99), state=st.booleans(), seed=st.integers(0, 2**16))
def test_property_split_and_resume(T, frac, state, seed):
    t1 = min(max(1, int(T * frac)), T - 1)
    fq, fk, v, init = make_inputs(1, T, 2, 16, 8, state=state, seed=seed)
    whole = ref.chunk_linear_attention(fq, fk, v, init, True)
    num, den, (h, s) = split_and_resume(ref.chunk_linear_attention, fq, fk, v, init, t1)
    assert_outputs_close(flat(whole), (num, den, h, s), 1e-5, OUTPUTS)


def test_reference_empty_sequence():
    fq, fk, v, init = make_inputs(1, 0, 2, 8, 4, state=True)
    num, den, (h, s) = ref.chunk_linear_attention(fq, fk, v, init, True)
    assert num.shape == (1, 0, 2, 4) and den.shape == (1, 0, 2)
    assert torch.equal(h, init[0]) and torch.equal(s, init[1])


# ---------------------------------------------------------------- triton vs reference


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T", SIZES_T)
@pytest.mark.parametrize("F,D", SIZES_FD)
def test_triton_matches_reference(triton_device, dtype, T, F, D):
    fq, fk, v, init = make_inputs(1, T, 2, F, D, dtype, triton_device, state=T != 63)
    expected = ref.chunk_linear_attention(fq, fk, v, init, True)
    num, den, (h, s) = triton_impl("chunk_linear_attention")(fq, fk, v, init, True)
    assert num.dtype == den.dtype == h.dtype == s.dtype == torch.float32
    assert_outputs_close(flat(expected), (num, den, h, s), tolerance(dtype), OUTPUTS)


@pytest.mark.parametrize("final", [False, True])
def test_triton_several_chunks_from_an_empty_state(triton_device, final):
    # No initial state, several chunks: the per-chunk key sums must be the running sums
    # (a compiler rewrite of the loop once stored only zeros and the total on sm_90).
    fq, fk, v, _ = make_inputs(1, 200, 2, 64, 64, device=triton_device)
    expected = ref.chunk_linear_attention(fq, fk, v, None, True)
    num, den, state = triton_impl("chunk_linear_attention")(fq, fk, v, None, final)
    assert_outputs_close(expected[:2], (num, den), 1e-5, OUTPUTS)
    if final:
        assert_outputs_close(expected[2], state, 1e-5, OUTPUTS[2:])
    else:
        assert state is None


def test_triton_no_final_state_and_odd_sizes(triton_device):
    # F and D below the 16-wide dot minimum, several batches: exercises masking
    fq, fk, v, _ = make_inputs(2, 70, 3, 5, 9, device=triton_device)
    expected = ref.chunk_linear_attention(fq, fk, v)
    num, den, final = triton_impl("chunk_linear_attention")(fq, fk, v)
    assert final is None
    assert_outputs_close(expected[:2], (num, den), 1e-5, OUTPUTS)


def test_triton_split_and_resume(triton_device):
    fq, fk, v, init = make_inputs(1, 150, 2, 64, 32, device=triton_device, state=True)
    whole = ref.chunk_linear_attention(fq, fk, v, init, True)
    num, den, (h, s) = split_and_resume(triton_impl("chunk_linear_attention"), fq, fk, v, init, 70)
    assert_outputs_close(flat(whole)[:3], (num, den, h), 1e-5, OUTPUTS)


def test_triton_empty_sequence(triton_device):
    fq, fk, v, init = make_inputs(1, 0, 2, 8, 4, device=triton_device, state=True)
    num, den, (h, s) = triton_impl("chunk_linear_attention")(fq, fk, v, init, True)
    assert num.shape == (1, 0, 2, 4) and torch.equal(h, init[0]) and torch.equal(s, init[1])


def test_public_op_on_triton(triton_device):
    fq, fk, v, init = make_inputs(1, 65, 2, 32, 16, torch.bfloat16, triton_device, state=True)
    with K.use_backend("triton"):
        num, den, final = K.chunk_linear_attention(fq, fk, v, initial_state=init, output_final_state=True)
    with K.use_backend("reference"):
        expected = K.chunk_linear_attention(fq, fk, v, initial_state=init, output_final_state=True)
    assert_outputs_close(flat(expected)[:3], (num, den, final[0]), 5e-3, OUTPUTS)


# ---------------------------------------------------------------- validation


def test_validation_messages():
    fq, fk, v, init = make_inputs(1, 5, 2, 8, 4, state=True)
    with pytest.raises(ValueError, match=r"fk must be \[B, T, H, F\], got shape \(2, 3\)"):
        K.chunk_linear_attention(fq, torch.zeros(2, 3), v)
    with pytest.raises(ValueError, match=r"v must be \[B, T, H, D\] with T=5"):
        K.chunk_linear_attention(fq, fk, v[:, :4])
    with pytest.raises(ValueError, match=r"initial_state\[0\] \(H0\) must be float32"):
        K.chunk_linear_attention(fq, fk, v, (init[0].half(), init[1]))
    with pytest.raises(ValueError, match=r"initial_state\[1\] \(s0\) must be \[B, H, F\]"):
        K.chunk_linear_attention(fq, fk, v, (init[0], init[1][..., :3]))
    with pytest.raises(ValueError, match=r"fq must be float32, float16 or bfloat16"):
        K.chunk_linear_attention(fq.long(), fk, v)


def test_triton_non_contiguous_and_mixed_dtypes(triton_device):
    # head-major views (as a [B, H, T, F] producer would hand over) and fp32 features with bf16 values
    fq = torch.rand(1, 2, 70, 16, device=triton_device).transpose(1, 2)
    fk = torch.rand(1, 2, 70, 16, device=triton_device).transpose(1, 2)
    v = torch.randn(1, 70, 2, 8, device=triton_device, dtype=torch.bfloat16)
    expected = ref.chunk_linear_attention(fq, fk, v)
    num, den, _ = triton_impl("chunk_linear_attention")(fq, fk, v)
    assert_outputs_close(expected[:2], (num, den), 1e-5, OUTPUTS)
