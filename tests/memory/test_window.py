import pytest
import torch

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
