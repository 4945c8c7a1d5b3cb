"""lola.core.thread_stack: a ``with`` block's item is on its thread's list while the block runs."""

import threading

import pytest

from lola.core.thread_stack import pushed


def test_the_item_itself_leaves_even_when_an_equal_one_is_outside():
    local = threading.local()
    outer, inner = [0], [0]  # equal, not the same object
    with pushed(local, "items", outer):
        with pushed(local, "items", inner) as got:
            assert got is inner and local.items == [outer, inner]
        assert len(local.items) == 1 and local.items[0] is outer  # list.remove would drop outer
    assert local.items == []


def test_the_item_leaves_when_the_block_raises():
    local = threading.local()
    with pytest.raises(RuntimeError, match="inside"):
        with pushed(local, "items", "x"):
            raise RuntimeError("inside")
    assert local.items == []


def test_another_thread_does_not_see_the_item():
    local = threading.local()
    seen = []
    with pushed(local, "items", "x"):
        thread = threading.Thread(target=lambda: seen.append(getattr(local, "items", None)))
        thread.start()
        thread.join()
    assert seen == [None]
