import re

import pytest
import torch

from lola.eval.niah import NOISE, make_niah_sample, make_sample, string_match_all, word_keys


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


def test_multikey_2_fills_the_haystack_with_distractor_needles():
    s = make_sample(WordTokenizer(), "niah_multikey_2", 600, 0.5, seed=1, max_new_tokens=10)
    needles = re.findall(r"One of the special magic numbers for (\S+) is: (\d{7})\.", s.text)
    assert len(needles) > 10 and (s.key, s.answers[0]) in needles
    assert sum(k == s.key for k, _ in needles) == 1  # the queried key appears once
    assert s.length <= 590


def test_multikey_3_uses_uuids():
    s = make_sample(WordTokenizer(), "niah_multikey_3", 400, 0.2, seed=2)
    uuid_re = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
    assert re.fullmatch(uuid_re, s.key) and re.fullmatch(uuid_re, s.answers[0])
    assert f"for {s.key} is: {s.answers[0]}." in s.text


def test_variable_tracking_chain_is_in_order():
    s = make_sample(WordTokenizer(), "vt", 500, 0.3, seed=3)
    chain = re.findall(r"VAR ([A-Z]{5}) = (VAR [A-Z]{5}|\d{5})", s.text)
    assert [c[0] for c in chain] == s.answers and len(s.answers) == 5
    assert chain[0][1] == s.key and all(chain[i + 1][1] == f"VAR {chain[i][0]}" for i in range(4))


def test_prose_haystack_and_own_needle():
    prose = "Alpha is first. Beta comes next! Gamma follows? Delta ends it all."
    s = make_sample(
        WordTokenizer(),
        "niah_single_1",
        300,
        0.5,
        seed=4,
        haystack=prose,
        needle="The access code for {key} is {value}.",
        question="What is the access code for {key}?",
    )
    assert f"The access code for {s.key} is {s.answers[0]}." in s.text
    assert "Beta comes next!" in s.text and NOISE not in s.text
    assert s.text.rstrip().endswith(f"What is the access code for {s.key}?")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(task="nope"), "unknown task"),
        (dict(needle="no fields here", question="q {key}"), r"\{key\}"),
        (dict(needle="{key} only", question="q {key}"), r"\{value\}"),
        (dict(needle="{key} {value}", question="no key"), "question"),
        (dict(needle="{key} {value}"), "together"),
        (dict(haystack="   "), "empty"),
        (dict(task="vt", haystack="Some text."), "niah_single_1 only"),
    ],
)
def test_bad_task_options(kwargs, match):
    args = dict(task="niah_single_1", length=300, depth=0.5, seed=0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        make_sample(WordTokenizer(), **args)
