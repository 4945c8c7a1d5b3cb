import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lola.kernels as K
from lola.kernels.recall_error import reference as ref

from .helpers import DTYPES, assert_close_rel, tolerance, triton_impl


def make_inputs(B, H, N, F, D, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    fk = torch.rand(B, H, N, F, generator=g)  # positive features keep fk.s away from 0
    v = torch.randn(B, H, N, D, generator=g)
    Hst = torch.randn(B, H, F, D, generator=g)
    s = torch.rand(B, H, F, generator=g) + 0.1
    return fk.to(device, dtype), v.to(device, dtype), Hst.to(device), s.to(device)


def explicit_formula(fk, v, Hst, s, eps):
    """Token-by-token float64 oracle of ||v - fk^T H / (fk^T s + eps)||."""
    B, H, N, _ = fk.shape
    out = torch.empty(B, H, N, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for n in range(N):
                f = fk[b, h, n].double()
                v_hat = (f @ Hst[b, h].double()) / (f @ s[b, h].double() + eps)
                out[b, h, n] = torch.sqrt(((v[b, h, n].double() - v_hat) ** 2).sum())
    return out


@pytest.mark.parametrize("N", [1, 7])
@pytest.mark.parametrize("eps", [1e-6, 0.5])
def test_reference_matches_explicit_formula(N, eps):
    fk, v, Hst, s = make_inputs(2, 2, N, 6, 5)
    err = ref.self_recall_error(fk, v, Hst, s, eps)
    assert err.dtype == torch.float32 and err.shape == (2, 2, N)
    assert_close_rel(explicit_formula(fk, v, Hst, s, eps), err, 1e-5)


@settings(max_examples=10, deadline=None)
@given(
    N=st.integers(1, 12),
    F=st.integers(1, 20),
    D=st.integers(1, 20),
    eps=st.sampled_from([1e-6, 1e-3, 1.0]),
    seed=st.integers(0, 2**16),
)
def test_property_reference_matches_explicit_formula(N, F, D, eps, seed):
    fk, v, Hst, s = make_inputs(1, 2, N, F, D, seed=seed)
    assert_close_rel(explicit_formula(fk, v, Hst, s, eps), ref.self_recall_error(fk, v, Hst, s, eps), 1e-5)


def test_reference_perfect_recall_is_zero():
    # a state built from one token recalls that token exactly: H = fk v^T, s = fk
    fk, v, _, _ = make_inputs(1, 1, 1, 8, 4)
    Hst = fk[:, :, 0, :, None] * v[:, :, 0, None, :]
    s = fk[:, :, 0]
    assert ref.self_recall_error(fk, v, Hst, s, eps=0.0).abs().max() < 1e-5


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", [1, 63, 65, 200])
@pytest.mark.parametrize("F", [64, 128])
@pytest.mark.parametrize("D", [60, 64])
def test_triton_matches_reference(triton_device, dtype, N, F, D):
    fk, v, Hst, s = make_inputs(1, 2, N, F, D, dtype, triton_device)
    expected = ref.self_recall_error(fk, v, Hst, s)
    err = triton_impl("self_recall_error")(fk, v, Hst, s)
    assert err.dtype == torch.float32
    assert_close_rel(expected, err, tolerance(dtype))


def test_triton_large_head_dim_and_odd_features(triton_device):
    # D > 128 spans several D tiles; F = 5 is below the dot minimum
    fk, v, Hst, s = make_inputs(2, 1, 70, 5, 200, device=triton_device)
    assert_close_rel(ref.self_recall_error(fk, v, Hst, s), triton_impl("self_recall_error")(fk, v, Hst, s), 1e-5)


def test_public_op_on_triton(triton_device):
    fk, v, Hst, s = make_inputs(1, 2, 33, 16, 8, torch.bfloat16, triton_device)
    with K.use_backend("triton"):
        got = K.self_recall_error(fk, v, Hst, s, eps=1e-3)
    with K.use_backend("reference"):
        expected = K.self_recall_error(fk, v, Hst, s, eps=1e-3)
    assert_close_rel(expected, got, 5e-3)


def test_validation_messages():
    fk, v, Hst, s = make_inputs(1, 2, 3, 4, 5)
    with pytest.raises(ValueError, match=r"H must be float32"):
        K.self_recall_error(fk, v, Hst.bfloat16(), s)
    with pytest.raises(ValueError, match=r"s must be \[B, H, F\] with F=4"):
        K.self_recall_error(fk, v, Hst, s[..., :2])
    with pytest.raises(ValueError, match=r"fk must be \[B, H, N, F\], got shape \(2, 3\)"):
        K.self_recall_error(torch.zeros(2, 3), v, Hst, s)
