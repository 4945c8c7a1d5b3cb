"""The repetition measure of greedy continuations."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lola.eval.generation import greedy_continuation, repeated_ngram_rate
from lola.models import tiny_random


def naive_rate(ids, n):
    grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
    return sum(g in grams[:i] for i, g in enumerate(grams)) / max(1, len(grams))


@given(st.lists(st.integers(0, 5), max_size=40), st.integers(1, 5))
@settings(max_examples=200, deadline=None)
def test_rate_matches_the_definition(ids, n):
    assert repeated_ngram_rate(ids, n) == pytest.approx(naive_rate(ids, n))


def test_rate_extremes():
    assert repeated_ngram_rate(list(range(50))) == 0.0
    assert repeated_ngram_rate([7] * 50) == pytest.approx(46 / 47)  # all but the first 4-gram repeat
    with pytest.raises(ValueError, match="n must be"):
        repeated_ngram_rate([1, 2], 0)


def test_greedy_continuation_has_the_asked_length():
    model, tok = tiny_random()
    ids = torch.tensor([tok("The quick brown fox").input_ids])
    out = greedy_continuation(model, ids, 12)
    assert len(out) == 12
    with torch.no_grad():  # greedy: the first token is the argmax after the prompt
        assert out[0] == int(model(ids).logits[0, -1].argmax())
