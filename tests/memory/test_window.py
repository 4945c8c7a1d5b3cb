import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lola.memory import SlidingWindow


def alloc(win: SlidingWindow, b=2, hs=1, d=3):
    win.allocate(b, hs, d, torch.float32, torch.device("cpu"), track_attention=False)
    return win


def tokens(pos_rows):
    pos = torch.tensor(pos_rows)
    b, l = pos.shape
    k = pos.float()[:, None, :, None].expand(b, 1, l, 3).clone()
    return k, k.clone(), pos


def test_append_keeps_order_and_pop_returns_oldest():
    win = alloc(SlidingWindow(2, max_pending=3))
    win.append(*tokens([[0, 1, 2], [0, 1, -1]]))
    left = win.pop_oldest(torch.tensor([True, True]))
    assert sorted(int(p) for p in left.pos[0, 0] if p >= 0) == [0]
    assert sorted(int(p) for p in left.pos[1, 0] if p >= 0) == []
    kept = win.block.pos[0, 0]
    assert sorted(int(p) for p in kept if p >= 0) == [1, 2]
    # stored keys follow their positions
    valid = win.block.pos[0, 0] >= 0
    assert torch.equal(win.block.k[0, 0, valid, 0], win.block.pos[0, 0, valid].float())


def test_pop_only_touches_selected_rows():
    win = alloc(SlidingWindow(1, max_pending=3))
    win.append(*tokens([[0, 1, 2], [0, 1, 2]]))
    win.pop_oldest(torch.tensor([True, False]))
    assert int((win.block.pos[0] >= 0).sum()) == 1 and int((win.block.pos[1] >= 0).sum()) == 3


def test_overflow_is_an_error_not_a_silent_drop():
    win = alloc(SlidingWindow(1, max_pending=1))
    win.append(*tokens([[0, 1], [0, 1]]))
    with pytest.raises(RuntimeError, match="overflow"):
        win.append(*tokens([[2, 3], [2, 3]]))


@pytest.mark.parametrize("kwargs", [dict(size=-1), dict(size=2, max_pending=0)])
def test_bad_sizes(kwargs):
    with pytest.raises(ValueError):
        SlidingWindow(**kwargs)


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(0, 4),
    pending=st.integers(1, 4),
    blocks=st.lists(st.tuples(st.integers(1, 4), st.booleans(), st.booleans(), st.booleans()), min_size=1, max_size=8),
)
def test_append_in_place_equals_out_of_place(size, pending, blocks):
    """The in-place scatter (autograd off, every token stored) writes what the out-of-place
    path writes: the same tokens in the same ring slots, after any sequence of appends and
    pops; and it writes into the storage it was given (the path under test is taken)."""
    windows = {mode: alloc(SlidingWindow(size, max_pending=pending), b=2, hs=2) for mode in ("in_place", "out_of_place")}
    nxt = [0, 0]
    for length, pad_row0, pop_row0, pop_row1 in blocks:
        length = min(length, pending)
        # a padded token (position -1, not stored: the scratch-slot path) leads row 0's block,
        # as left padding does; the stored positions stay consecutive
        pad = int(pad_row0 and length > 1)
        pos = torch.tensor([[-1] * pad + [nxt[0] + i for i in range(length - pad)], [nxt[1] + i for i in range(length)]])
        nxt = [nxt[0] + length - pad, nxt[1] + length]
        k = torch.randn(2, 2, length, 3)
        v = torch.randn(2, 2, length, 3)
        rows = torch.tensor([pop_row0, pop_row1])
        for mode, win in windows.items():
            before = win.block.k.data_ptr()
            with torch.set_grad_enabled(mode == "out_of_place"):
                held = int((win.block.pos >= 0).sum(-1).max())
                if held + length > win.capacity:
                    win.pop_oldest(torch.tensor([True, True]))
                win.append(k, v, pos)
                stored_all = bool((pos >= 0).all())
                assert (win.block.k.data_ptr() == before) == (mode == "in_place" and stored_all)
                win.pop_oldest(rows)
    a, b = windows["in_place"].block, windows["out_of_place"].block
    for f in ("k", "v", "pos"):
        assert torch.equal(getattr(a, f), getattr(b, f))
