"""The ragged run of exact slots: its definition (pad_ragged), its checks, its device offsets."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lola.kernels as K
from lola.kernels.ragged import RaggedSlots, device_offsets, pad_ragged

from ..strategies import ragged_offsets, seeds
from .helpers import make_ragged


@settings(max_examples=25, deadline=None)
@given(offsets=ragged_offsets(heads=(1, 4), longest=6), B=st.integers(1, 2), D=st.integers(1, 4), seed=seeds)
def test_pad_ragged_puts_each_range_first_in_its_head(offsets, B, D, seed):
    r = make_ragged(B, offsets, D, seed=seed)
    Hs = len(offsets) - 1
    k, v, pos = pad_ragged(r, Hs)
    lengths = [offsets[h + 1] - offsets[h] for h in range(Hs)]
    assert k.shape == v.shape == (B, Hs, max(lengths), D) and pos.shape == (B, Hs, max(lengths))
    flat = 0
    for h, n in enumerate(lengths):  # the run, walked slot by slot
        for j in range(n):
            assert torch.equal(k[:, h, j], r.k[:, flat]) and torch.equal(v[:, h, j], r.v[:, flat])
            assert torch.equal(pos[:, h, j], r.pos[:, flat])
            flat += 1
        assert (pos[:, h, n:] == -1).all() and (k[:, h, n:] == 0).all() and (v[:, h, n:] == 0).all()
    assert flat == r.k.shape[1]


def test_pad_ragged_of_an_all_empty_run_is_an_empty_cache():
    k, v, pos = pad_ragged(make_ragged(2, (0, 0, 0), 3), 2)
    assert k.shape == (2, 2, 0, 3) and pos.shape == (2, 2, 0) and pos.dtype == torch.int64


def test_pad_ragged_checks_the_heads():
    with pytest.raises(ValueError, match=r"ragged.offsets must hold Hs\+1=4 ints"):
        pad_ragged(make_ragged(1, (0, 2, 5), 3), 3)


def test_device_offsets_is_cached_per_layout():
    t = device_offsets((0, 3, 3, 7), torch.device("cpu"))
    assert t.dtype == torch.int64 and t.tolist() == [0, 3, 3, 7]
    assert device_offsets((0, 3, 3, 7), torch.device("cpu")) is t
    assert device_offsets((0, 3, 4, 7), torch.device("cpu")) is not t


def _exact_inputs(Hs=2, N=4, D=8):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2 * Hs, 3, D, generator=g)
    k, v = torch.randn(1, Hs, N, D, generator=g), torch.randn(1, Hs, N, D, generator=g)
    return q, k, v, torch.arange(3)[None], torch.arange(N).repeat(1, Hs, 1)


def _decode_inputs(Hs=2, N=4, D=8, F=4):
    g = torch.Generator().manual_seed(0)
    H = 2 * Hs
    return dict(
        q=torch.randn(1, H, D, generator=g),
        k=torch.randn(1, Hs, N, D, generator=g),
        v=torch.randn(1, Hs, N, D, generator=g),
        k_pos=torch.arange(N).repeat(1, Hs, 1),
        fq=torch.rand(1, H, F, generator=g),
        H=torch.randn(1, H, F, D, generator=g),
        s=torch.rand(1, H, F, generator=g),
        gate=torch.rand(H, generator=g),
    )


def _malformed():
    """(ragged run, error type, message) for a layer with B=1, Hs=2, D=8 and a float32 cache."""
    good = make_ragged(1, (0, 2, 5), 8)
    return [
        ((good.k, good.v, good.pos, good.offsets), TypeError, r"ragged must be a RaggedSlots"),
        (good._replace(offsets=[0, 2, 5]), TypeError, r"ragged.offsets must be a tuple of Hs\+1=3 ints"),
        (good._replace(offsets=torch.tensor([0, 2, 5])), TypeError, r"ragged.offsets must be a tuple"),
        (good._replace(offsets=(0, 5)), ValueError, r"ragged.offsets must hold Hs\+1=3 ints"),
        (good._replace(offsets=(0, 2, 5, 5)), ValueError, r"ragged.offsets must hold Hs\+1=3 ints"),
        (good._replace(offsets=(1, 2, 5)), ValueError, r"ragged.offsets must run from 0 to S=5"),
        (good._replace(offsets=(0, 2, 4)), ValueError, r"ragged.offsets must run from 0 to S=5"),
        (good._replace(offsets=(0, 6, 5)), ValueError, r"ragged.offsets must be nondecreasing, got 6 then 5"),
        (good._replace(k=good.k[0]), ValueError, r"ragged.k must be \[B, S, D\]"),
        (good._replace(k=good.k[..., :4]), ValueError, r"ragged.k must be \[B, S, D\] with D=8 \(as in k\)"),
        (good._replace(k=good.k.expand(2, -1, -1)), ValueError, r"ragged.k must be \[B, S, D\] with B=1 \(as in k\)"),
        (good._replace(v=good.v[:, :4]), ValueError, r"ragged.v must be \[B, S, D\] with S=5 \(as in ragged.k\)"),
        (good._replace(pos=good.pos[:, :, None]), ValueError, r"ragged.pos must be \[B, S\]"),
        (good._replace(v=good.v.double()), ValueError, r"ragged.v must be torch.float32 like the cache's v"),
        (good._replace(k=good.k.half()), ValueError, r"ragged.k must be torch.float32 like the cache's k"),
        (good._replace(pos=good.pos.int()), ValueError, r"ragged.pos must be an int64 tensor"),
        (good._replace(pos=good.pos.float()), ValueError, r"ragged.pos must be an int64 tensor"),
        (good._replace(v=good.v.to("meta")), ValueError, r"ragged.v must be on cpu like k, got meta"),
    ]


@pytest.mark.parametrize("case", range(len(_malformed())))
def test_both_ops_reject_a_malformed_run_naming_it(case):
    ragged, error, message = _malformed()[case]
    with pytest.raises(error, match=message):
        K.softmax_partial(*_exact_inputs(), 0.5, ragged=ragged)
    with pytest.raises(error, match=message):
        K.decode_step(**_decode_inputs(), mixing="lolcats", scale=0.5, ragged=ragged)


def test_a_well_formed_run_passes_and_check_false_skips_the_check():
    good = make_ragged(1, (0, 2, 5), 8)
    K.softmax_partial(*_exact_inputs(), 0.5, ragged=good)
    K.decode_step(**_decode_inputs(), mixing="softmax_only", scale=0.5, ragged=good)
    # a tuple of ints in a list is what check=True refuses; unchecked, the reference reads it
    K.softmax_partial(*_exact_inputs(), 0.5, ragged=good._replace(offsets=[0, 2, 5]), check=False)


def test_the_run_decides_the_backend_too():
    """The ragged tensors are inspected like the cache: one that needs gradients sends the op to
    the reference even when Triton is asked for (the Triton ops have no backward)."""
    ragged = make_ragged(1, (0, 2, 5), 8)
    ragged = ragged._replace(k=ragged.k.requires_grad_())
    with K.use_backend("triton"), K.record_calls() as calls:
        num, _, _ = K.softmax_partial(*_exact_inputs(), 0.5, ragged=ragged)
        K.decode_step(**_decode_inputs(), mixing="lolcats", scale=0.5, ragged=ragged)
    assert calls == {("softmax_partial", "reference"): 1, ("decode_step", "reference"): 1}
    assert num.requires_grad


def test_ragged_slots_is_exported():
    assert K.RaggedSlots is RaggedSlots and K.pad_ragged is pad_ragged
    assert {"RaggedSlots", "pad_ragged"} <= set(K.__all__)
