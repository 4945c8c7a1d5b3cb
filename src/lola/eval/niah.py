"""RULER-style needle-in-a-haystack prompts, generated offline and seeded.

Tasks (RULER's offline subset):

=================  =============================================  ==============  ==============
task               haystack                                       key             value
=================  =============================================  ==============  ==============
niah_single_1      noise (five sentences repeated)                adjective-noun  7-digit number
niah_multikey_2    needles (every filler line a distractor)       adjective-noun  7-digit number
niah_multikey_3    needles                                        uuid            uuid
vt                 noise + a 4-hop chain ``VAR X = VAR Y``         5 letters       5-digit number
=================  =============================================  ==============  ==============

The needle ``One of the special magic {type} for {key} is: {value}.`` sits at a chosen depth;
the prompt is wrapped in the model's chat template and followed by the answer prefix, and the
haystack is the largest that keeps ``prompt + max_new_tokens <= length`` tokens. A prose
haystack (the sentences of any text) and your own needle/question templates can replace the
defaults for the single-needle task.
"""

from __future__ import annotations

import random
import re
import string
import uuid
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Callable

__all__ = ["NOISE", "TASKS", "NiahSample", "check_templates", "make_niah_sample", "make_sample", "string_match_all", "word_keys"]

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
TASKS = ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "vt")
NEEDLE = "One of the special magic {type} for {key} is: {value}."
TEMPLATE = (
    "A special magic {type1} is hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {type1} afterwards.\n{context}\n"
    "What is the special magic {type1} for {query} mentioned in the provided text?"
)
ANSWER_PREFIX = " The special magic {type1} for {query} mentioned in the provided text is"
VT_TEMPLATE = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
    "Question: Find all variables that are assigned the value {query} in the text above."
)
VT_ANSWER_PREFIX = " Answer: According to the chain(s) of variable assignment in the text above, 5 variables are assigned the value {query}, they are:"


@dataclass
class NiahSample:
    """One prompt.

    Attributes:
        input_ids: ``[1, T]`` token ids of the chat-wrapped prompt plus answer prefix.
        answers: reference strings (all must appear in the prediction).
        depth: depth of the (first) needle in ``[0, 1]`` (fraction of haystack lines before it).
        key: the queried key (for ``vt``, the value whose variables are asked for).
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


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _encode(tokenizer: Any, text: str, prefix: str):
    messages = [{"role": "user", "content": text}]
    chat = bool(getattr(tokenizer, "chat_template", None))
    if chat:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    text = text + prefix
    return tokenizer(text, return_tensors="pt", add_special_tokens=not chat).input_ids, text


def prose_lines(text: str) -> list[str]:
    """The sentences of a text, as haystack lines (whitespace normalised)."""
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", " ".join(text.split())) if s.strip()]
    if not sentences:
        raise ValueError("the haystack text is empty")
    return sentences


def _fit(tokenizer: Any, length: int, max_new_tokens: int, build: Callable[[int], tuple[Any, str]], haystack: str | None = None) -> tuple[Any, str]:
    """The largest haystack (in lines) whose prompt fits ``length - max_new_tokens`` tokens.

    With a user's ``haystack`` (its name, for the message), a prompt with none of its lines is
    refused: the text was asked for and would be dropped. The built-in noise may be absent
    from a very short prompt (tiny test lengths), as before."""
    budget = length - max_new_tokens
    lo, hi = 0, max(1, budget // 8)
    while build(hi)[0].shape[-1] <= budget:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if build(mid)[0].shape[-1] <= budget else (lo, mid)
    ids, text = build(lo)
    if lo == 0 and haystack is not None and ids.shape[-1] <= budget:  # the template fits, but not one line of the user's haystack
        raise ValueError(
            f"length {length} leaves no room for one line of {haystack} beside the prompt template ({ids.shape[-1]} tokens) and max_new_tokens "
            f"{max_new_tokens}: the prompt would hold no haystack at all; give a longer length, or a haystack with shorter sentences"
        )
    if ids.shape[-1] > budget:
        raise ValueError(
            f"length {length} is too short for the prompt template with max_new_tokens {max_new_tokens}: the shortest prompt has "
            f"{ids.shape[-1]} tokens and {max_new_tokens} are kept for the answer; give a length of at least {ids.shape[-1] + max_new_tokens} "
            "or a smaller max_new_tokens"
        )
    return ids, text


# The placeholders each custom template may use, and those it must use.
TEMPLATE_FIELDS = {"needle": ({"key", "value", "type"}, {"key", "value"}), "question": ({"key"}, {"key"}), "answer_prefix": ({"key"}, set())}


def check_templates(needle: str | None, question: str | None, answer_prefix: str | None) -> None:
    """Refuse a custom template that :meth:`str.format` would fail on or that lacks a field:
    unknown placeholders (``{oops}``), unbalanced braces, attribute or index lookups, a
    conversion or format spec (``{key!r}``, ``{value:>5}``), and a
    needle without ``{key}`` and ``{value}`` or a question without ``{key}``.

    Raises:
        ValueError: naming the template (``needle``, ``question``, ``answer_prefix``), the
            placeholder and the ones it may use.
    """
    import string

    for name, template in (("needle", needle), ("question", question), ("answer_prefix", answer_prefix)):
        if template is None:
            continue
        allowed, required = TEMPLATE_FIELDS[name]
        try:
            parts = [(f, spec, conversion) for _, f, spec, conversion in string.Formatter().parse(template) if f is not None]
        except ValueError as err:  # "Single '}' encountered in format string"
            raise ValueError(f"{name} template {template!r}: {err} (write a literal brace as {{{{ or }}}})") from None
        for f, spec, conversion in parts:
            # A conversion (!r) or format spec (:>5, nested {key:{value}}) formats a value the
            # template does not own (or fails on it only once prompts are built): plain {field} only.
            if conversion or spec:
                written = "{" + f + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
                raise ValueError(f"{name} template {template!r}: placeholder {written} has a conversion or format spec; write it as {{{f}}}")
        fields = {f for f, _, _ in parts}
        unknown = sorted(fields - allowed)
        if unknown:
            raise ValueError(
                f"{name} template {template!r}: unknown placeholder {{{unknown[0]}}}; it may use {', '.join(f'{{{f}}}' for f in sorted(allowed))}"
                " (write a literal brace as {{ or }})"
            )
        missing = sorted(required - fields)
        if missing:
            raise ValueError(f"{name} template {template!r} must contain {{{missing[0]}}}")


def make_sample(
    tokenizer: Any,
    task: str,
    length: int,
    depth: float,
    seed: int,
    max_new_tokens: int = 16,
    haystack: str | None = None,
    needle: str | None = None,
    question: str | None = None,
    answer_prefix: str | None = None,
    haystack_name: str | None = None,
) -> NiahSample:
    """Build one prompt of ``task`` with at most ``length - max_new_tokens`` tokens.

    Args:
        tokenizer: the model's tokenizer (its chat template is used when it has one).
        task: one of :data:`TASKS`.
        length: target context length in tokens, generation included.
        depth: needle depth in ``[0, 1]``.
        seed: seeds keys, values and filler.
        max_new_tokens: tokens reserved for the answer.
        haystack: a text whose sentences replace the noise haystack (``niah_single_1`` only).
        needle: a template with ``{key}`` and ``{value}`` replacing the default needle
            (``niah_single_1`` only); requires ``question``.
        question: the question, with ``{key}``; the prompt then ends with the question alone.
        answer_prefix: with ``question``, text (with ``{key}``) that starts the model's answer,
            e.g. ``" The code for {key} is"``, so that the answer's first tokens are the value.
        haystack_name: how messages name ``haystack`` (e.g. ``--haystack-file book.txt``).

    Raises:
        ValueError: bad arguments, or a ``length`` that leaves no room for the template, the
            answer and at least one haystack line.
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; available: {', '.join(TASKS)}")
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth}")
    if (haystack is not None or needle is not None or question is not None) and task != "niah_single_1":
        raise ValueError("haystack, needle and question apply to niah_single_1 only")
    if (needle is None) != (question is None):
        raise ValueError("needle and question must be given together")
    if answer_prefix is not None and question is None:
        raise ValueError("answer_prefix needs a custom question (the default template has its own prefix)")
    check_templates(needle, question, answer_prefix)
    rng = random.Random(seed)
    filler = prose_lines(haystack) if haystack is not None else [NOISE]
    what = (haystack_name or "the haystack text") if haystack is not None else None
    start = rng.randrange(len(filler))

    def lines_of(n: int) -> list[str]:
        return [filler[(start + i) % len(filler)] for i in range(n)]

    if task == "vt":
        names = ["".join(rng.choice(string.ascii_uppercase) for _ in range(5)) for _ in range(5)]
        value = str(rng.randint(10_000, 99_999))
        chain = [f"VAR {names[0]} = {value}"] + [f"VAR {names[i + 1]} = VAR {names[i]}" for i in range(4)]
        fractions = sorted([depth] + [rng.random() * (1 - depth) + depth for _ in range(4)])

        def build(n: int):
            at = [round(f * n) for f in fractions]  # non-decreasing: the chain stays in order
            lines: list[str] = []
            for i, line in enumerate([*lines_of(n), None]):
                lines += [c for c, a in zip(chain, at) if a == i]
                if line is not None:
                    lines.append(line)
            return _encode(tokenizer, VT_TEMPLATE.format(context="\n".join(lines), query=value), VT_ANSWER_PREFIX.format(query=value))

        ids, text = _fit(tokenizer, length, max_new_tokens, build, what)
        return NiahSample(ids, names, depth, value, text)

    uuids = task == "niah_multikey_3"
    kind = "uuids" if uuids else "numbers"
    key = _uuid(rng) if uuids else rng.choice(word_keys())
    value = _uuid(rng) if uuids else str(rng.randint(1_000_000, 9_999_999))
    needle_line = (needle or NEEDLE).format(type=kind, key=key, value=value)
    distractors: list[str] = []

    def build(n: int):
        if task == "niah_single_1":
            lines = lines_of(n)
        else:  # every filler line is a needle for another key
            while len(distractors) < n:
                k = _uuid(rng) if uuids else rng.choice(word_keys())
                if k != key:
                    distractors.append(NEEDLE.format(type=kind, key=k, value=_uuid(rng) if uuids else str(rng.randint(1_000_000, 9_999_999))))
            lines = distractors[:n]
        lines = list(lines)
        lines.insert(round(depth * n), needle_line)
        context = "\n".join(lines)
        if question is not None:
            return _encode(tokenizer, f"{context}\n{question.format(key=key)}", (answer_prefix or "").format(key=key))
        type1 = kind[:-1]
        return _encode(tokenizer, TEMPLATE.format(type1=type1, context=context, query=key), ANSWER_PREFIX.format(type1=type1, query=key))

    ids, text = _fit(tokenizer, length, max_new_tokens, build, what)
    return NiahSample(ids, [value], depth, key, text)


def make_niah_sample(tokenizer: Any, length: int, depth: float, seed: int, max_new_tokens: int = 16) -> NiahSample:
    """An S-NIAH-1 prompt (``make_sample(tokenizer, "niah_single_1", ...)``)."""
    return make_sample(tokenizer, "niah_single_1", length, depth, seed, max_new_tokens)


def string_match_all(prediction: str, references: list[str]) -> float:
    """RULER's score: the fraction of references found (case-insensitive) in the prediction."""
    if not references:
        raise ValueError("references must be non-empty")
    pred = prediction.lower()
    return sum(r.lower() in pred for r in references) / len(references)
