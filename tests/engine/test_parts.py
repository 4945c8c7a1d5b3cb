"""What the engine reads of the parts (lola.engine.parts): declarations, not types or truthiness."""

from types import SimpleNamespace

from lola.engine.parts import binds_buffer, describe_part, slot_widths
from lola.memory import SlidingWindow, SparseCache


def test_only_a_declared_binding_counts():
    assert binds_buffer(SparseCache(4)) and binds_buffer(SlidingWindow(4))
    assert not binds_buffer(SimpleNamespace(binds=1))  # truthy is not declared
    assert not binds_buffer(SimpleNamespace(binds=lambda: True))  # a method is not a declaration
    assert not binds_buffer(object())


def test_a_ragged_store_is_held_by_its_heads_sizes():
    assert slot_widths(SparseCache([2, 5, 0])) == [2, 5, 0]
    assert slot_widths(SparseCache(6)) == 6

    class Overrides(SparseCache):  # may fill past a head's size: the capability is dropped
        def select(self, candidates, scores, rows):
            return super().select(candidates, scores, rows)

    assert slot_widths(Overrides([2, 5, 0])) == 5  # held padded, at its capacity


def test_a_part_with_the_default_repr_is_described_by_class_and_capacity():
    class Plain:
        capacity = 3

    assert describe_part(Plain()).endswith("Plain(capacity=3)") and "0x" not in describe_part(Plain())
    assert describe_part(SparseCache(4)) == repr(SparseCache(4))
