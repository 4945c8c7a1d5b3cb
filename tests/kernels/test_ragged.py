"""The ragged run of exact slots: its definition (pad_ragged), its device offsets."""

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


def test_ragged_slots_is_exported():
    assert K.RaggedSlots is RaggedSlots and K.pad_ragged is pad_ragged
    assert {"RaggedSlots", "pad_ragged"} <= set(K.__all__)
