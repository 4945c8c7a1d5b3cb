import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lola.kernels as K
from lola.kernels.exact_attention import reference as ref

from ..strategies import ragged_offsets, seeds
from .helpers import DTYPES, assert_close_rel, assert_outputs_close, make_ragged, padded_cache, tolerance, triton_impl

OUTPUTS = ("num", "den", "max")


def make_inputs(B, H, Hs, L, N, D, dtype=torch.float32, device="cpu", empty_frac=0.25, seed=0, logit_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=g) * logit_scale
    k = torch.randn(B, Hs, N, D, generator=g)
    v = torch.randn(B, Hs, N, D, generator=g)
    # keys: a shuffled sparse cache of positions in [0, 2N), some slots empty
    k_pos = torch.stack([torch.randperm(2 * N, generator=g)[:N] for _ in range(B * Hs)]).view(B, Hs, N)
    k_pos[torch.rand(B, Hs, N, generator=g) < empty_frac] = -1
    # queries: increasing positions; the first one may see nothing
    q_pos = torch.sort(torch.randint(0, 2 * N + 1, (B, L), generator=g), dim=-1).values
    to = dict(device=device)
    return (q.to(dtype=dtype, **to), k.to(dtype=dtype, **to), v.to(dtype=dtype, **to), q_pos.to(**to), k_pos.to(**to))


def dense_masked_softmax(q, k, v, q_pos, k_pos, scale):
    """Independent float64 oracle: repeat k/v per query head, torch.softmax over visible keys."""
    B, H, L, D = q.shape
    Hs, N = k.shape[1], k.shape[2]
    if N == 0:
        zeros = torch.zeros(B, H, L, dtype=torch.float64)
        return torch.zeros(B, H, L, D, dtype=torch.float64), zeros, zeros - math.inf
    kk = k.double().repeat_interleave(H // Hs, dim=1)
    vv = v.double().repeat_interleave(H // Hs, dim=1)
    kp = k_pos.repeat_interleave(H // Hs, dim=1)[:, :, None, :]  # [B, H, 1, N]
    visible = (kp >= 0) & (kp <= q_pos[:, None, :, None])
    logits = scale * torch.einsum("bhld,bhnd->bhln", q.double(), kk)
    logits = logits.masked_fill(~visible, -math.inf)
    any_visible = visible.any(-1)
    m = torch.where(any_visible, logits.amax(-1), torch.full_like(logits[..., 0], -math.inf))
    lse = torch.logsumexp(logits, -1)
    den = torch.where(any_visible, torch.exp(lse - m), torch.zeros_like(lse))
    probs = torch.softmax(logits.masked_fill(~any_visible[..., None], 0.0), -1) * visible
    num = (probs @ vv) * den[..., None]
    return num, den, m


SIZES_N = [1, 63, 65, 200]


@pytest.mark.parametrize("N", SIZES_N)
@pytest.mark.parametrize("H,Hs", [(2, 2), (4, 2), (3, 1)])
def test_reference_matches_dense(N, H, Hs):
    q, k, v, q_pos, k_pos = make_inputs(2, H, Hs, 7, N, 16)
    num, den, mx = ref.softmax_partial(q, k, v, q_pos, k_pos, 0.25)
    assert num.dtype == den.dtype == mx.dtype == torch.float32
    assert_outputs_close(dense_masked_softmax(q, k, v, q_pos, k_pos, 0.25), (num, den, mx), 1e-5, OUTPUTS)


@settings(max_examples=10, deadline=None)
@given(
    L=st.integers(1, 9),
    N=st.integers(0, 80),
    G=st.integers(1, 3),
    Hs=st.integers(1, 2),
    D=st.sampled_from([1, 5, 16]),
    empty=st.floats(0, 1),
    seed=st.integers(0, 2**16),
)
def test_property_reference_matches_dense(L, N, G, Hs, D, empty, seed):
    q, k, v, q_pos, k_pos = make_inputs(1, G * Hs, Hs, L, N, D, empty_frac=empty, seed=seed)
    got = ref.softmax_partial(q, k, v, q_pos, k_pos, D**-0.5)
    want = dense_masked_softmax(q, k, v, q_pos, k_pos, D**-0.5)
    assert_outputs_close(want, got, 1e-5, OUTPUTS)


def test_partials_of_disjoint_key_sets_combine():
    """The property the LoLA mixing relies on: partials over a split cache merge exactly."""
    q, k, v, q_pos, k_pos = make_inputs(1, 2, 2, 5, 100, 16)
    full = ref.softmax_partial(q, k, v, q_pos, k_pos, 0.3)
    a = ref.softmax_partial(q, k[:, :, :40], v[:, :, :40], q_pos, k_pos[:, :, :40], 0.3)
    b = ref.softmax_partial(q, k[:, :, 40:], v[:, :, 40:], q_pos, k_pos[:, :, 40:], 0.3)
    m = torch.maximum(a[2], b[2])
    ca, cb = torch.exp(a[2] - m).nan_to_num(0.0), torch.exp(b[2] - m).nan_to_num(0.0)
    assert_close_rel(full[0], ca[..., None] * a[0] + cb[..., None] * b[0], 1e-5, "num")
    assert_close_rel(full[1], ca * a[1] + cb * b[1], 1e-5, "den")


def _check_nothing_visible(fn, device):
    q, k, v, q_pos, k_pos = make_inputs(1, 2, 1, 3, 70, 16, device=device)
    k_pos = torch.full_like(k_pos, -1)
    k_pos[..., 5] = 10
    q_pos = torch.tensor([[-1, 9, 10]], device=device)  # the first two rows see nothing
    num, den, mx = fn(q, k, v, q_pos, k_pos, 0.5)
    assert not num.isnan().any() and not den.isnan().any() and not mx.isnan().any()
    assert (num[:, :, :2] == 0).all() and (den[:, :, :2] == 0).all()
    assert (mx[:, :, :2] == -math.inf).all()
    assert torch.allclose(den[:, :, 2], torch.ones_like(den[:, :, 2]))  # exactly one key visible
    assert torch.allclose(num[:, :, 2], v[:, 0:1, 5].float().expand(1, 2, 16))


def _check_huge_logits(fn, device, dtype=torch.float32):
    # |s| up to ~1e4: online rescaling must not overflow or produce NaN
    q, k, v, q_pos, k_pos = make_inputs(1, 2, 2, 4, 130, 16, dtype, device, logit_scale=300.0)
    num, den, mx = fn(q, k, v, q_pos, k_pos, 1.0)
    e_num, e_den, e_max = dense_masked_softmax(q, k, v, q_pos, k_pos, 1.0)
    assert torch.isfinite(num).all() and torch.isfinite(den).all()
    assert e_max[torch.isfinite(e_max)].abs().max() > 1e3
    assert_close_rel(e_max, mx, 1e-5, "max")
    assert (den[torch.isfinite(e_max)] >= 1).all()
    assert_close_rel(e_num, num, 1e-2, "num")  # |s| ~ 1e4: fp32 logit rounding ~1e-3 absolute


def test_reference_nothing_visible():
    _check_nothing_visible(ref.softmax_partial, "cpu")


def test_reference_huge_logits():
    _check_huge_logits(ref.softmax_partial, "cpu")


def test_reference_empty_cache():
    q, k, v, q_pos, k_pos = make_inputs(1, 2, 1, 3, 0, 8)
    num, den, mx = ref.softmax_partial(q, k, v, q_pos, k_pos, 1.0)
    assert (num == 0).all() and (den == 0).all() and (mx == -math.inf).all()


# ---------------------------------------------------------------- triton vs reference


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", SIZES_N)
@pytest.mark.parametrize("D,H,Hs", [(60, 2, 1), (64, 2, 2)])
def test_triton_matches_reference(triton_device, dtype, N, D, H, Hs):
    q, k, v, q_pos, k_pos = make_inputs(1, H, Hs, 17, N, D, dtype, triton_device)
    expected = ref.softmax_partial(q, k, v, q_pos, k_pos, D**-0.5)
    got = triton_impl("softmax_partial")(q, k, v, q_pos, k_pos, D**-0.5)
    assert all(o.dtype == torch.float32 for o in got)
    assert_outputs_close(expected, got, tolerance(dtype), OUTPUTS)


def test_triton_long_queries_gqa(triton_device):
    q, k, v, q_pos, k_pos = make_inputs(2, 4, 2, 70, 65, 32, device=triton_device)
    expected = ref.softmax_partial(q, k, v, q_pos, k_pos, 0.2)
    got = triton_impl("softmax_partial")(q, k, v, q_pos, k_pos, 0.2)
    assert_outputs_close(expected, got, 1e-5, OUTPUTS)


def test_triton_nothing_visible(triton_device):
    _check_nothing_visible(triton_impl("softmax_partial"), triton_device)


@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_huge_logits(triton_device, dtype):
    _check_huge_logits(triton_impl("softmax_partial"), triton_device, dtype)


def test_triton_empty_cache(triton_device):
    q, k, v, q_pos, k_pos = make_inputs(1, 2, 1, 3, 0, 8, device=triton_device)
    num, den, mx = triton_impl("softmax_partial")(q, k, v, q_pos, k_pos, 1.0)
    assert (num == 0).all() and (den == 0).all() and (mx == -math.inf).all()


def test_public_op_on_triton(triton_device):
    q, k, v, q_pos, k_pos = make_inputs(1, 2, 1, 5, 40, 16, torch.bfloat16, triton_device)
    with K.use_backend("triton"):
        got = K.softmax_partial(q, k, v, q_pos, k_pos, 0.25)
    with K.use_backend("reference"):
        expected = K.softmax_partial(q, k, v, q_pos, k_pos, 0.25)
    assert_outputs_close(expected, got, 5e-3, OUTPUTS)


def test_validation_messages():
    q, k, v, q_pos, k_pos = make_inputs(1, 3, 2, 4, 10, 8, empty_frac=0.0)
    with pytest.raises(ValueError, match=r"multiple of k/v heads Hs=2"):
        K.softmax_partial(q, k, v, q_pos, k_pos, 1.0)
    q, k, v, q_pos, k_pos = make_inputs(1, 2, 1, 4, 10, 8)
    with pytest.raises(ValueError, match=r"k_pos must be \[B, Hs, N\]"):
        K.softmax_partial(q, k, v, q_pos, k_pos[0], 1.0)
    with pytest.raises(ValueError, match=r"v must be \[B, Hs, N, D\] with N=10"):
        K.softmax_partial(q, k, v[:, :, :3], q_pos, k_pos, 1.0)
    with pytest.raises(ValueError, match=r"q_pos must be an integer"):
        K.softmax_partial(q, k, v, q_pos.float(), k_pos, 1.0)


# ---------------------------------------------------------------- ragged slots


def ragged_case(B, Hs, G, L, N, D, offsets, dtype=torch.float32, device="cpu", empty=0.25, seed=0):
    """Inputs and a ragged run whose positions mix with the cache's, queries at random positions."""
    q, k, v, _, k_pos = make_inputs(B, G * Hs, Hs, L, N, D, dtype, device, empty_frac=empty, seed=seed)
    top = 2 * (N + offsets[-1]) + 1
    ragged = make_ragged(B, offsets, D, dtype, device, empty_frac=empty, max_pos=top, seed=seed + 1)
    q_pos = torch.sort(torch.randint(0, top + 1, (B, L), generator=torch.Generator().manual_seed(seed)), dim=-1).values
    return (q, k, v, q_pos.to(device), k_pos), ragged


@settings(max_examples=30, deadline=None)
@given(
    offsets=ragged_offsets(heads=(1, 3), longest=70),
    B=st.integers(1, 2),
    G=st.integers(1, 3),
    L=st.integers(1, 6),
    N=st.integers(0, 20),
    D=st.sampled_from([1, 5, 16]),
    dtype=st.sampled_from(DTYPES),
    empty=st.floats(0, 1),
    seed=seeds,
)
def test_property_reference_ragged_is_the_padded_cache(offsets, B, G, L, N, D, dtype, empty, seed):
    (q, k, v, q_pos, k_pos), ragged = ragged_case(B, len(offsets) - 1, G, L, N, D, offsets, dtype, empty=empty, seed=seed)
    pk, pv, pp = padded_cache(k, v, k_pos, ragged)
    expected = dense_masked_softmax(q, pk, pv, q_pos, pp, D**-0.5)
    # num = Σ e^(s - m) v sums values of both signs: its rounding is relative to Σ e^(s - m) |v|
    # (a sum that cancels to 0.0013 of terms near 1 was off by 8e-5 of itself, summed in another order)
    v_most = float(pv.float().abs().max()) if pv.numel() else 0.0  # the run's values too (the dense cache may be empty)
    floors = {"num": float(expected[1].float().norm()) * v_most}
    assert_outputs_close(ref.softmax_partial(q, pk, pv, q_pos, pp, D**-0.5), expected, 1e-5, OUTPUTS, floors)
    # both forms of a ragged read (the dispatch picks one by size), with and without positions
    for form in (ref.softmax_partial, ref.partials_ragged_masked, ref.partials_ragged_by_head):
        assert_outputs_close(expected, form(q, k, v, q_pos, k_pos, D**-0.5, ragged), 1e-5, OUTPUTS, floors)
    newest = q_pos.new_full(q_pos.shape, 10**6)  # a query newer than every slot reads as q_pos=None
    unmasked = dense_masked_softmax(q, pk, pv, newest, pp, D**-0.5)
    floors_unmasked = {"num": float(unmasked[1].float().norm()) * v_most}
    for form in (ref.partials_ragged_masked, ref.partials_ragged_by_head):
        assert_outputs_close(unmasked, form(q, k, v, None, k_pos, D**-0.5, ragged), 1e-5, OUTPUTS, floors_unmasked)


def test_a_long_ragged_read_is_computed_head_by_head(monkeypatch):
    # the dispatch: a prefill block over a long run takes the head-by-head form, a short read the
    # masked one (both equal the padded cache above)
    (q, k, v, q_pos, k_pos), ragged = ragged_case(1, 3, 3, 64, 8, 8, (0, 10, 300, 700), empty=0.1)
    picked = []
    for name in ("partials_ragged_masked", "partials_ragged_by_head"):
        real = getattr(ref, name)
        monkeypatch.setattr(ref, name, lambda *a, real=real, name=name: picked.append(name) or real(*a))
    ref.softmax_partial(q, k, v, q_pos, k_pos, 0.5, ragged)
    (q, k, v, q_pos, k_pos), ragged = ragged_case(1, 3, 3, 1, 8, 8, (0, 10, 30, 70), empty=0.1)
    ref.softmax_partial(q, k, v, q_pos, k_pos, 0.5, ragged)
    assert picked == ["partials_ragged_by_head", "partials_ragged_masked"]


def _check_slots_belong_to_their_head(fn, device):
    """Moving one slot from head 0's range to head 1's changes both heads' partials."""
    (q, k, v, q_pos, k_pos), ragged = ragged_case(1, 2, 1, 4, 3, 8, (0, 3, 6), device=device, empty=0.0)
    q_pos = torch.full_like(q_pos, 1000)  # every slot visible
    a = fn(q, k, v, q_pos, k_pos, 0.5, ragged)
    b = fn(q, k, v, q_pos, k_pos, 0.5, ragged._replace(offsets=(0, 2, 6)))
    for h in range(2):
        assert not torch.allclose(a[1][:, h], b[1][:, h]), f"head {h} did not see the slot move"


def test_reference_ragged_slots_belong_to_their_head():
    _check_slots_belong_to_their_head(ref.softmax_partial, "cpu")


def test_triton_ragged_slots_belong_to_their_head(triton_device):
    _check_slots_belong_to_their_head(triton_impl("softmax_partial"), triton_device)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    offsets=ragged_offsets(heads=(1, 3), longest=80),
    G=st.integers(1, 2),
    L=st.integers(1, 20),
    N=st.integers(0, 70),
    dtype=st.sampled_from(DTYPES),
    empty=st.floats(0, 1),
    seed=seeds,
)
def test_property_triton_ragged_matches_reference(triton_device, offsets, G, L, N, dtype, empty, seed):
    D = 16
    (q, k, v, q_pos, k_pos), ragged = ragged_case(1, len(offsets) - 1, G, L, N, D, offsets, dtype, triton_device, empty, seed)
    expected = ref.softmax_partial(q, k, v, q_pos, k_pos, D**-0.5, ragged)
    got = triton_impl("softmax_partial")(q, k, v, q_pos, k_pos, D**-0.5, ragged)
    assert_outputs_close(expected, got, tolerance(dtype), OUTPUTS)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offsets", [(0, 0, 0), (0, 130, 130), (0, 1, 66)])
def test_triton_ragged_matches_reference(triton_device, dtype, offsets):
    """Empty runs and ranges, one longer than two tiles, one starting off a tile boundary."""
    (q, k, v, q_pos, k_pos), ragged = ragged_case(2, 2, 2, 17, 65, 60, offsets, dtype, triton_device)
    expected = ref.softmax_partial(q, k, v, q_pos, k_pos, 0.2, ragged)
    with K.use_backend("triton"):
        got = K.softmax_partial(q, k, v, q_pos, k_pos, 0.2, ragged=ragged)
    assert_outputs_close(expected, got, tolerance(dtype), OUTPUTS)
