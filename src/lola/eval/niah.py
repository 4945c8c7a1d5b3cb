"""RULER-style needle-in-a-haystack prompts, generated offline and seeded.

Follows RULER's ``niah_single_1`` (S-NIAH-1, the pass-key task): a noise haystack (the same
five sentences repeated), one needle ``One of the special magic numbers for {key} is: {value}.``
with an ``adjective-noun`` word key and a 7-digit value, placed at a chosen depth; the prompt
is wrapped in the model's chat template and followed by the answer prefix. The haystack is the
largest that keeps ``prompt + max_new_tokens <= length`` tokens.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

__all__ = ["NOISE", "NiahSample", "make_niah_sample", "string_match_all", "word_keys"]

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic numbers for {key} is: {value}."
TEMPLATE = (
    "A special magic number is hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the number afterwards.\n{context}\n"
    "What is the special magic number for {query} mentioned in the provided text?"
)
ANSWER_PREFIX = " The special magic number for {query} mentioned in the provided text is"


@dataclass
class NiahSample:
    """One prompt.

    Attributes:
        input_ids: ``[1, T]`` token ids of the chat-wrapped prompt plus answer prefix.
        answers: reference strings (all must appear in the prediction).
        depth: needle depth in ``[0, 1]`` (fraction of haystack lines before it).
        key: the needle's key.
        text: the prompt as text.
    """

    input_ids: Any
    answers: list[str]
    depth: float
    key: str
    text: str

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[-1])


@lru_cache(maxsize=1)
def word_keys() -> list[str]:
    """Sorted ``adjective-noun`` keys from the wonderwords lists (as RULER builds them)."""

    def words(name: str) -> list[str]:
        text = resources.files("wonderwords").joinpath("assets", name).read_text()
        return [w.strip() for w in text.splitlines() if w.strip() and "-" not in w and " " not in w]

    return sorted({f"{a}-{n}" for a in words("adjectivelist.txt")[:200] for n in words("nounlist.txt")[:200]})


def _encode(tokenizer: Any, text: str, query: str):
    messages = [{"role": "user", "content": text}]
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    text = text + ANSWER_PREFIX.format(query=query)
    return tokenizer(text, return_tensors="pt", add_special_tokens=not getattr(tokenizer, "chat_template", None)).input_ids, text


def make_niah_sample(tokenizer: Any, length: int, depth: float, seed: int, max_new_tokens: int = 16) -> NiahSample:
    """Build one S-NIAH-1 prompt of at most ``length - max_new_tokens`` tokens.

    Args:
        tokenizer: the model's tokenizer (its chat template is used when it has one).
        length: target context length in tokens, generation included.
        depth: needle depth in ``[0, 1]``.
        seed: seeds the key and the value.
        max_new_tokens: tokens reserved for the answer.
    """
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth}")
    rng = random.Random(seed)
    key = rng.choice(word_keys())
    value = str(rng.randint(1_000_000, 9_999_999))
    needle = NEEDLE.format(key=key, value=value)

    def build(n_lines: int):
        lines = [NOISE] * n_lines
        lines.insert(round(depth * n_lines), needle)
        return _encode(tokenizer, TEMPLATE.format(context="\n".join(lines), query=key), key)

    budget = length - max_new_tokens
    lo, hi = 0, max(1, budget // 8)
    while build(hi)[0].shape[-1] <= budget:  # grow until too long
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # largest haystack that fits
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if build(mid)[0].shape[-1] <= budget else (lo, mid)
    ids, text = build(lo)
    if ids.shape[-1] > budget:
        raise ValueError(f"length {length} is too short for the prompt template ({ids.shape[-1]} tokens + {max_new_tokens} to generate)")
    return NiahSample(ids, [value], depth, key, text)


def string_match_all(prediction: str, references: list[str]) -> float:
    """RULER's score: the fraction of references found (case-insensitive) in the prediction."""
    if not references:
        raise ValueError("references must be non-empty")
    pred = prediction.lower()
    return sum(r.lower() in pred for r in references) / len(references)
