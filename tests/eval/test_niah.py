import re

import pytest
import torch

from lola.eval.niah import NOISE, make_niah_sample, string_match_all, word_keys


class WordTokenizer:
    """One token per whitespace-separated word; no chat template."""

    chat_template = None

    def __call__(self, text, return_tensors=None, add_special_tokens=True):
        ids = torch.tensor([[hash(w) % 1000 for w in text.split()]])
        return type("Enc", (), {"input_ids": ids})()


@pytest.mark.parametrize("length", [200, 1000])
@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_prompt_fits_the_length_and_hides_one_needle(length, depth):
    s = make_niah_sample(WordTokenizer(), length, depth, seed=3, max_new_tokens=10)
    assert s.length <= length - 10
    assert s.length > length - 10 - len(NOISE.split()) - 1  # as large a haystack as fits
    needles = re.findall(r"One of the special magic numbers for (\S+) is: (\d{7})\.", s.text)
    assert needles == [(s.key, s.answers[0])]
    assert s.text.endswith(f"The special magic number for {s.key} mentioned in the provided text is")
    lines = s.text.split("\n")
    at = next(i for i, line in enumerate(lines) if line.startswith("One of the special"))
    haystack = [i for i, line in enumerate(lines) if line == NOISE]
    before = sum(i < at for i in haystack)
    assert abs(before / max(1, len(haystack)) - depth) <= 1 / max(1, len(haystack)) + 1e-9


def test_seeded_and_keys_are_adjective_noun():
    a = make_niah_sample(WordTokenizer(), 300, 0.3, seed=7)
    b = make_niah_sample(WordTokenizer(), 300, 0.3, seed=7)
    assert a.text == b.text and a.answers == b.answers
    assert re.fullmatch(r"[a-z]+-[a-z]+", a.key) and a.key in word_keys()
    assert 1_000_000 <= int(a.answers[0]) <= 9_999_999


def test_bad_arguments():
    with pytest.raises(ValueError, match="depth"):
        make_niah_sample(WordTokenizer(), 300, 1.5, seed=0)
    with pytest.raises(ValueError, match="too short"):
        make_niah_sample(WordTokenizer(), 40, 0.5, seed=0)


def test_string_match_all():
    assert string_match_all("The number is 1234567.", ["1234567"]) == 1.0
    assert string_match_all("nothing", ["1234567", "x"]) == 0.0
    assert string_match_all("ABC and x", ["abc", "y"]) == 0.5
    with pytest.raises(ValueError):
        string_match_all("a", [])
