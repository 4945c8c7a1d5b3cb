"""Each row's count and countdown (lola.engine.row_counts): the host copies follow the device
count without reading it back, and the schedule is asked in one checked place."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lola.engine.row_counts import RowCounts, ask_schedule, check_until
from lola.schedules import Chunkwise


class _Counting:
    """Chunkwise(period), counting how often it is asked."""

    def __init__(self, period: int) -> None:
        self.inner = Chunkwise(period)
        self.period = period
        self.asked = 0

    def tokens_until_step(self, seen: torch.Tensor) -> torch.Tensor:
        self.asked += 1
        return self.inner.tokens_until_step(seen)


@settings(max_examples=50, deadline=None)
@given(
    start=st.lists(st.integers(0, 200), min_size=1, max_size=5),
    moves=st.lists(st.one_of(st.integers(1, 9), st.lists(st.integers(0, 9), min_size=5, max_size=5)), max_size=8),
)
def test_host_copies_follow_the_device_count(start, moves):
    """Advancing by an int keeps the host copies equal to ``seen`` without a read; advancing by a
    tensor makes them unknown until asked, and then they are read (and right) again."""
    counts = RowCounts()
    counts.set(torch.tensor(start))
    assert counts.host is None and counts.host_seen() == start
    expected = list(start)
    for move in moves:
        if isinstance(move, int):
            counts.advance(move)
            expected = [x + move for x in expected]
            assert counts.host == expected  # followed on the host, nothing read
        else:
            n = torch.tensor(move[: len(expected)] + [0] * (len(expected) - len(move)))
            counts.advance(n)
            expected = [x + int(y) for x, y in zip(expected, n)]
            assert counts.host is None
        assert counts.seen.tolist() == expected
        assert counts.host_seen() == expected
        assert counts.host_range() == (min(expected), max(expected))
        assert counts.in_step() == (len(set(expected)) == 1)


def test_the_schedule_is_asked_once_until_the_counts_change():
    schedule = _Counting(8)
    counts = RowCounts()
    counts.set(torch.tensor([3, 10]))
    assert counts.host_due(schedule) == [5, 6]  # steps fall on positions 7 and 15
    assert counts.host_due(schedule) == [5, 6] and schedule.asked == 1
    counts.set(torch.tensor([7, 7]))  # a change the host cannot follow: asked again
    assert counts.host_due(schedule) == [1, 1] and schedule.asked == 2


def test_no_rows_have_an_empty_range():
    counts = RowCounts()
    counts.set(torch.zeros(0, dtype=torch.long))
    assert counts.host_range() == (0, 0) and counts.host_due(Chunkwise(4)) == []


class _Answers:
    period = 4

    def __init__(self, answer):
        self.answer = answer

    def tokens_until_step(self, seen):
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer(seen) if callable(self.answer) else self.answer

    def __repr__(self) -> str:
        return "Answers()"


@pytest.mark.parametrize(
    "answer, error, match",
    [
        (ValueError("boom"), RuntimeError, r"Answers\(\) failed in tokens_until_step\(\): ValueError: boom"),
        ([1, 1], TypeError, "returned list"),
        (lambda s: s.float(), TypeError, "torch.float32"),
        (lambda s: s > 0, TypeError, "torch.bool"),
        (lambda s: s[:1], ValueError, "shape"),
    ],
)
def test_a_bad_answer_names_the_schedule(answer, error, match):
    with pytest.raises(error, match=match):
        ask_schedule(_Answers(answer), torch.tensor([1, 2]))


def test_a_memory_error_is_not_blamed_on_the_schedule():
    with pytest.raises(MemoryError):
        ask_schedule(_Answers(MemoryError()), torch.tensor([1]))


@pytest.mark.parametrize("lo, hi, ok", [(1, 4, True), (2, 3, True), (0, 4, False), (1, 5, False)])
def test_answers_must_lie_in_one_period(lo, hi, ok):
    if ok:
        check_until(_Answers(None), lo, hi)
    else:
        with pytest.raises(ValueError, match=r"expected 1\.\.4 \(its period\)"):
            check_until(_Answers(None), lo, hi)
