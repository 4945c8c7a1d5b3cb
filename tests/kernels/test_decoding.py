import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lola.kernels as K
from lola.kernels.decoding import reference as ref

from ..strategies import ragged_offsets, seeds
from .helpers import DTYPES, assert_close_rel, make_ragged, padded_cache, tolerance, triton_impl

RULES = ref.MIXING_RULES


def make_inputs(B, H, Hs, N, D, F, dtype=torch.float32, device="cpu", empty_frac=0.25, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, D, generator=g)
    k = torch.randn(B, Hs, N, D, generator=g)
    v = torch.randn(B, Hs, N, D, generator=g)
    k_pos = torch.arange(N).repeat(B, Hs, 1)
    k_pos[torch.rand(B, Hs, N, generator=g) < empty_frac] = -1
    fq = torch.rand(B, H, F, generator=g) / F
    Hst = torch.randn(B, H, F, D, generator=g)
    s = torch.rand(B, H, F, generator=g) + 0.5
    gate = torch.rand(H, generator=g)
    dev = dict(device=device)
    return dict(
        q=q.to(dtype=dtype, **dev),
        k=k.to(dtype=dtype, **dev),
        v=v.to(dtype=dtype, **dev),
        k_pos=k_pos.to(**dev),
        fq=fq.to(dtype=dtype, **dev),
        H=Hst.to(**dev),
        s=s.to(**dev),
        gate=gate.to(**dev),
    )


def explicit_decode(x, mixing, scale):
    """Independent float64 oracle from the unshifted definitions (moderate logits only)."""
    q, k, v, k_pos = x["q"].double(), x["k"].double(), x["v"].double(), x["k_pos"]
    G = q.shape[1] // k.shape[1]
    k, v, k_pos = (t.repeat_interleave(G, dim=1) for t in (k, v, k_pos))
    logits = scale * torch.einsum("bhd,bhnd->bhn", q, k)
    p = torch.exp(logits) * (k_pos >= 0)  # unshifted
    S_num, S_den = torch.einsum("bhn,bhnd->bhd", p, v), p.sum(-1)
    masked = torch.cat([logits.masked_fill(k_pos < 0, -math.inf), logits.new_full((*logits.shape[:-1], 1), -math.inf)], -1)
    m = masked.amax(-1)  # the extra -inf column keeps amax defined when N = 0
    shift = torch.exp(-torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
    E_num, E_den = S_num * shift[..., None], S_den * shift  # shifted partials
    fq = x["fq"].double()
    L_num = torch.einsum("bhf,bhfd->bhd", fq, x["H"].double())
    L_den = (fq * x["s"].double()).sum(-1)
    w = x["gate"].double()[None, :]
    if mixing == "lolcats":
        num, den = w[..., None] * E_num + L_num, w * E_den + L_den
    elif mixing == "lolcats_affine":
        num, den = w[..., None] * E_num + (1 - w[..., None]) * L_num, w * E_den + (1 - w) * L_den
    elif mixing == "lola_authors":
        num, den = w[..., None] * S_num + (1 - w[..., None]) * L_num, w * S_den + (1 - w) * L_den
    else:
        num, den = E_num, E_den
    out = num / den[..., None]
    return torch.where(den[..., None] == 0, torch.zeros_like(out), out)


@pytest.mark.parametrize("mixing", RULES)
@pytest.mark.parametrize("N", [1, 65])
def test_reference_matches_explicit(mixing, N):
    x = make_inputs(2, 4, 2, N, 16, 8)
    o = ref.decode_step(**x, mixing=mixing, scale=0.25)
    assert o.dtype == torch.float32 and o.shape == (2, 4, 16)
    assert_close_rel(explicit_decode(x, mixing, 0.25), o, 1e-5)


@settings(max_examples=10, deadline=None)
@given(
    mixing=st.sampled_from(RULES),
    N=st.integers(0, 40),
    G=st.integers(1, 3),
    empty=st.floats(0, 1),
    seed=st.integers(0, 2**16),
)
def test_property_reference_matches_explicit(mixing, N, G, empty, seed):
    x = make_inputs(1, 2 * G, 2, N, 8, 4, empty_frac=empty, seed=seed)
    assert_close_rel(explicit_decode(x, mixing, 0.3), ref.decode_step(**x, mixing=mixing, scale=0.3), 1e-5)


def partials(B=1, H=2, L=1, D=4, e_max=0.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return dict(
        e_num=torch.randn(B, H, L, D, generator=g),
        e_den=torch.rand(B, H, L, generator=g) + 1,
        e_max=torch.full((B, H, L), float(e_max)),
        l_num=torch.randn(B, H, L, D, generator=g),
        l_den=torch.rand(B, H, L, generator=g) + 1,
        gate=torch.rand(H, generator=g),
    )


@pytest.mark.parametrize("mixing", RULES)
def test_mix_zero_denominator_gives_zero(mixing):
    p = partials()
    p["e_den"].zero_()
    p["e_num"].zero_()
    p["e_max"].fill_(-math.inf)  # nothing visible
    p["l_den"].zero_()
    o = ref.mix_partials(**p, mixing=mixing)
    assert torch.equal(o, torch.zeros_like(o))


def test_mix_nothing_visible_uses_linear_part():
    p = partials()
    p["e_num"].zero_(), p["e_den"].zero_(), p["e_max"].fill_(-math.inf)
    expected = p["l_num"] / p["l_den"][..., None]
    for mixing in ("lolcats", "lolcats_affine", "lola_authors"):
        assert_close_rel(expected, ref.mix_partials(**p, mixing=mixing), 1e-6, mixing)


@pytest.mark.parametrize("m", [1e3, 1e4, -1e4])
def test_mix_lola_authors_is_stable_for_huge_max(m):
    p = partials(e_max=m)
    o = ref.mix_partials(**p, mixing="lola_authors")
    assert torch.isfinite(o).all()
    if m > 0:  # e^m swamps the linear part: pure softmax
        assert_close_rel(p["e_num"] / p["e_den"][..., None], o, 1e-6)
    else:  # e^m vanishes: pure linear
        assert_close_rel(p["l_num"] / p["l_den"][..., None], o, 1e-6)


def test_mix_rejects_unknown_rule():
    with pytest.raises(ValueError, match="mixing must be one of lolcats, lolcats_affine"):
        ref.mix_partials(**partials(), mixing="nope")


# ---------------------------------------------------------------- triton vs reference


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mixing", RULES)
@pytest.mark.parametrize("N", [1, 63, 65, 200])
@pytest.mark.parametrize("D,F", [(60, 64), (64, 128)])
def test_triton_matches_reference(triton_device, dtype, mixing, N, D, F):
    x = make_inputs(2, 4, 2, N, D, F, dtype, triton_device)
    expected = ref.decode_step(**x, mixing=mixing, scale=D**-0.5)
    o = triton_impl("decode_step")(**x, mixing=mixing, scale=D**-0.5)
    assert o.dtype == torch.float32 and o.shape == expected.shape
    assert_close_rel(expected, o, tolerance(dtype))


@pytest.mark.parametrize("mixing", RULES)
def test_triton_empty_cache_and_huge_logits(triton_device, mixing):
    x = make_inputs(2, 3, 1, 70, 16, 8, device=triton_device, empty_frac=0.0)
    x["k_pos"][0] = -1  # batch row 0: empty cache
    x["q"] = x["q"] * 2000.0  # batch row 1: logits ~1e4
    expected = ref.decode_step(**x, mixing=mixing, scale=0.25)
    o = triton_impl("decode_step")(**x, mixing=mixing, scale=0.25)
    assert torch.isfinite(o).all()
    if mixing == "softmax_only":
        assert (o[0] == 0).all()
    assert_close_rel(expected, o, 1e-3)


def test_triton_softmax_only_without_linear_state(triton_device):
    x = make_inputs(1, 2, 2, 20, 16, 8, device=triton_device)
    x.update(fq=None, H=None, s=None)
    expected = ref.decode_step(**x, mixing="softmax_only", scale=0.25)
    with K.use_backend("triton"):
        o = K.decode_step(**x, mixing="softmax_only", scale=0.25)
    assert_close_rel(expected, o, 1e-5)


def test_public_op_on_triton(triton_device):
    x = make_inputs(2, 4, 1, 33, 32, 16, torch.bfloat16, triton_device)
    with K.use_backend("triton"):
        o = K.decode_step(**x, mixing="lola_authors", scale=0.2)
    with K.use_backend("reference"):
        expected = K.decode_step(**x, mixing="lola_authors", scale=0.2)
    assert_close_rel(expected, o, 5e-3)


def test_validation_messages():
    x = make_inputs(1, 2, 1, 5, 8, 4)
    with pytest.raises(ValueError, match=r"gate must be \[H\] with H=2"):
        K.decode_step(**{**x, "gate": torch.rand(3)}, mixing="lolcats", scale=1.0)
    with pytest.raises(ValueError, match=r"H must be float32"):
        K.decode_step(**{**x, "H": x["H"].half()}, mixing="lolcats", scale=1.0)
    with pytest.raises(ValueError, match=r"fq must be a tensor of shape \[B, H, F\]"):
        K.decode_step(**{**x, "fq": None}, mixing="lolcats", scale=1.0)
    with pytest.raises(ValueError, match=r"mixing must be one of"):
        K.decode_step(**x, mixing="softmax", scale=1.0)
    with pytest.raises(ValueError, match=r"k_pos must be an integer"):
        K.decode_step(**{**x, "k_pos": x["k_pos"].float()}, mixing="lolcats", scale=1.0)


def test_the_reference_decode_step_compiles_as_one_graph_on_cpu():
    """torch.compile traces the decode step whole (no graph break: no host read, no Python
    branch on a tensor value), and the compiled step equals the eager one."""
    from lola.kernels.decoding.reference import decode_step

    B, H, Hs, N, D, F = 2, 4, 2, 24, 16, 32
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(B, H, D, generator=g), torch.randn(B, Hs, N, D, generator=g), torch.randn(B, Hs, N, D, generator=g)
    pos = torch.randint(-1, 50, (B, Hs, N), generator=g)
    fq, Hm, s, gate = torch.rand(B, H, F, generator=g), torch.rand(B, H, F, D, generator=g), torch.rand(B, H, F, generator=g), torch.rand(H, generator=g)
    compiled = torch.compile(decode_step, fullgraph=True, dynamic=False)
    with torch.no_grad():  # as decoding runs
        got = compiled(q, k, v, pos, fq, Hm, s, gate, "lola_authors", 0.25)
    torch.testing.assert_close(got, decode_step(q, k, v, pos, fq, Hm, s, gate, "lola_authors", 0.25), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- ragged slots


def with_ragged(B, Hs, G, N, D, F, offsets, dtype=torch.float32, device="cpu", empty=0.25, seed=0):
    """Decode inputs and a ragged run (every non-empty slot is visible to the decode query)."""
    x = make_inputs(B, G * Hs, Hs, N, D, F, dtype, device, empty_frac=empty, seed=seed)
    return x, make_ragged(B, offsets, D, dtype, device, empty_frac=empty, seed=seed + 1)


def on_padded_cache(x, ragged):
    k, v, k_pos = padded_cache(x["k"], x["v"], x["k_pos"], ragged)
    return {**x, "k": k, "v": v, "k_pos": k_pos}


@settings(max_examples=30, deadline=None)
@given(
    mixing=st.sampled_from(RULES),
    offsets=ragged_offsets(heads=(1, 3), longest=50),
    B=st.integers(1, 2),
    G=st.integers(1, 3),
    N=st.integers(0, 20),
    dtype=st.sampled_from(DTYPES),
    empty=st.floats(0, 1),
    seed=seeds,
)
def test_property_reference_ragged_is_the_padded_cache(mixing, offsets, B, G, N, dtype, empty, seed):
    x, ragged = with_ragged(B, len(offsets) - 1, G, N, 8, 4, offsets, dtype, empty=empty, seed=seed)
    got = ref.decode_step(**x, mixing=mixing, scale=0.3, ragged=ragged)
    padded = on_padded_cache(x, ragged)
    assert_close_rel(ref.decode_step(**padded, mixing=mixing, scale=0.3), got, 1e-5)
    assert_close_rel(explicit_decode(padded, mixing, 0.3), got, 1e-5)


def _check_slots_belong_to_their_head(fn, device):
    """Moving one slot from head 0's range to head 1's changes both heads' outputs."""
    x, ragged = with_ragged(1, 2, 1, 3, 8, 4, (0, 3, 6), device=device, empty=0.0)
    a = fn(**x, mixing="softmax_only", scale=0.5, ragged=ragged)
    b = fn(**x, mixing="softmax_only", scale=0.5, ragged=ragged._replace(offsets=(0, 2, 6)))
    for h in range(2):
        assert not torch.allclose(a[:, h], b[:, h]), f"head {h} did not see the slot move"


def test_reference_ragged_slots_belong_to_their_head():
    _check_slots_belong_to_their_head(ref.decode_step, "cpu")


def test_triton_ragged_slots_belong_to_their_head(triton_device):
    _check_slots_belong_to_their_head(triton_impl("decode_step"), triton_device)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    mixing=st.sampled_from(RULES),
    offsets=ragged_offsets(heads=(1, 3), longest=80),
    G=st.integers(1, 3),
    N=st.integers(0, 70),
    dtype=st.sampled_from(DTYPES),
    empty=st.floats(0, 1),
    seed=seeds,
)
def test_property_triton_ragged_matches_reference(triton_device, mixing, offsets, G, N, dtype, empty, seed):
    x, ragged = with_ragged(2, len(offsets) - 1, G, N, 16, 8, offsets, dtype, triton_device, empty, seed)
    expected = ref.decode_step(**x, mixing=mixing, scale=0.25, ragged=ragged)
    o = triton_impl("decode_step")(**x, mixing=mixing, scale=0.25, ragged=ragged)
    assert_close_rel(expected, o, tolerance(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mixing", RULES)
@pytest.mark.parametrize("offsets", [(0, 0, 0), (0, 130, 130), (0, 1, 66)])
def test_triton_ragged_matches_reference(triton_device, dtype, mixing, offsets):
    """Every mixing rule; empty runs and ranges, one longer than two tiles, one starting off a
    tile boundary."""
    x, ragged = with_ragged(2, 2, 2, 65, 60, 64, offsets, dtype, triton_device)
    expected = ref.decode_step(**x, mixing=mixing, scale=60**-0.5, ragged=ragged)
    with K.use_backend("triton"):
        o = K.decode_step(**x, mixing=mixing, scale=60**-0.5, ragged=ragged)
    assert_close_rel(expected, o, tolerance(dtype))


def test_triton_ragged_softmax_only_without_linear_state(triton_device):
    x, ragged = with_ragged(1, 2, 2, 0, 16, 8, (0, 5, 40), device=triton_device)
    x.update(fq=None, H=None, s=None)
    expected = ref.decode_step(**x, mixing="softmax_only", scale=0.25, ragged=ragged)
    with K.use_backend("triton"):
        o = K.decode_step(**x, mixing="softmax_only", scale=0.25, ragged=ragged)
    assert_close_rel(expected, o, 1e-5)


# ---------------------------------------------------------------- the share cap


def explicit_capped(x, mixing, scale, cap):
    """float64 oracle of a capped decode step: where the state's share ``α`` of the free output
    exceeds the row's cap ``c`` and an exact slot is visible, ``c · L_num/L_den + (1 − c) ·
    E_num/E_den`` (``α`` from the unshifted definitions of each rule)."""
    free, exact = explicit_decode(x, mixing, scale), explicit_decode(x, "softmax_only", scale)
    q, k, k_pos = x["q"].double(), x["k"].double(), x["k_pos"]
    G = q.shape[1] // k.shape[1]
    k, k_pos = k.repeat_interleave(G, dim=1), k_pos.repeat_interleave(G, dim=1)
    logits = scale * torch.einsum("bhd,bhnd->bhn", q, k)
    visible = k_pos >= 0
    S_den = (torch.exp(logits) * visible).sum(-1)
    m = logits.masked_fill(~visible, -math.inf).amax(-1) if k.shape[2] else torch.full(S_den.shape, -math.inf, dtype=S_den.dtype)
    E_den = torch.where(visible.any(-1), S_den * torch.exp(-torch.where(torch.isfinite(m), m, 0.0)), 0.0)
    fq = x["fq"].double()
    L_num, L_den = torch.einsum("bhf,bhfd->bhd", fq, x["H"].double()), (fq * x["s"].double()).sum(-1)
    w = x["gate"].double()[None, :]
    exact_w, lin_w = {"lolcats": (w * E_den, L_den), "lolcats_affine": (w * E_den, (1 - w) * L_den), "lola_authors": (w * S_den, (1 - w) * L_den)}[mixing]
    share = torch.where(exact_w + lin_w == 0, 0.0, lin_w / (exact_w + lin_w))
    c = cap.double()[:, None]
    capped = c[..., None] * torch.where(L_den[..., None] == 0, 0.0, L_num / L_den[..., None]) + (1 - c[..., None]) * exact
    return torch.where(((share > c) & visible.any(-1))[..., None], capped, free)


def capped_inputs(B, H, Hs, N, D, F, device="cpu", seed=0):
    """Decode inputs whose state's share is large (a small exact gate), and caps per row, one of
    them 1 (no cap)."""
    x = make_inputs(B, H, Hs, N, D, F, device=device, seed=seed)
    x["gate"] = torch.full_like(x["gate"], 0.02)
    cap = torch.tensor([0.05, 1.0, 0.3][:B], device=device)
    return x, cap


MIXING_WITH_STATE = [r for r in RULES if r != "softmax_only"]


@settings(max_examples=30, deadline=None)
@given(mixing=st.sampled_from(MIXING_WITH_STATE), B=st.integers(1, 3), G=st.integers(1, 3), N=st.integers(0, 20), seed=seeds)
def test_property_reference_share_cap_matches_explicit(mixing, B, G, N, seed):
    x, cap = capped_inputs(B, 2 * G, 2, N, 8, 4, seed=seed)
    got = ref.decode_step(**x, mixing=mixing, scale=0.3, share_cap=cap)
    assert_close_rel(explicit_capped(x, mixing, 0.3, cap), got, 1e-5)


def test_the_share_cap_changes_the_capped_rows_only():
    x, cap = capped_inputs(2, 4, 2, 12, 8, 4)
    free = ref.decode_step(**x, mixing="lola_authors", scale=0.3)
    capped = ref.decode_step(**x, mixing="lola_authors", scale=0.3, share_cap=cap)
    assert torch.equal(capped[1], free[1])  # cap 1: no cap
    assert not torch.allclose(capped[0], free[0])  # cap 0.05 binds (the checks above can fail)


@pytest.mark.parametrize("mixing", MIXING_WITH_STATE)
@pytest.mark.parametrize("offsets", [None, (0, 0, 9), (0, 70, 75)])
def test_triton_share_cap_matches_reference(triton_device, mixing, offsets):
    x, cap = capped_inputs(3, 4, 2, 65, 16, 8, device=triton_device)
    ragged = None if offsets is None else make_ragged(3, offsets, 16, torch.float32, triton_device, seed=1)
    expected = ref.decode_step(**x, mixing=mixing, scale=0.25, ragged=ragged, share_cap=cap)
    with K.use_backend("triton"):
        o = K.decode_step(**x, mixing=mixing, scale=0.25, ragged=ragged, share_cap=cap)
    assert_close_rel(expected, o, 1e-5)


def test_share_cap_validation():
    x, cap = capped_inputs(2, 4, 2, 5, 8, 4)
    with pytest.raises(ValueError, match=r"share_cap must be a \[B\] = \(2,\) floating tensor"):
        K.decode_step(**x, mixing="lola_authors", scale=1.0, share_cap=cap[:1])
    with pytest.raises(ValueError, match=r"share_cap must hold values in \(0, 1\]"):
        K.decode_step(**x, mixing="lola_authors", scale=1.0, share_cap=torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"softmax_only does not read it"):
        K.decode_step(**x, mixing="softmax_only", scale=1.0, share_cap=cap)
