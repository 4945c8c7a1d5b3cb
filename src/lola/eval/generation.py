"""Greedy continuations and how much they repeat themselves: the check perplexity cannot make.

A linearized model can lower its perplexity and still write loops ("the first day of the year.
The first day…"); the repeated n-gram rate of its greedy continuation, beside the stock model's
on the same prompt, catches that.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["greedy_continuation", "repeated_ngram_rate"]


def repeated_ngram_rate(ids: list[int], n: int = 4) -> float:
    """Fraction of the ``n``-grams of ``ids`` that already occurred earlier in ``ids`` (0 = no repeats)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    seen: set[tuple[int, ...]] = set()
    repeats = total = 0
    for i in range(len(ids) - n + 1):
        gram = tuple(ids[i : i + n])
        repeats += gram in seen
        seen.add(gram)
        total += 1
    return repeats / total if total else 0.0


@torch.no_grad()
def greedy_continuation(model: Any, ids: torch.Tensor, new_tokens: int, cache_factory: Callable[[], Any] | None = None) -> list[int]:
    """The ``new_tokens`` greedy tokens that follow ``ids [1, L]`` (no early stop at EOS)."""
    kwargs: dict[str, Any] = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False}
    if cache_factory is not None:
        kwargs["cache"] = cache_factory()
    eos = getattr(model.generation_config, "eos_token_id", None)
    pad = getattr(model.generation_config, "pad_token_id", None)
    pad = pad if pad is not None else (eos[0] if isinstance(eos, list) and eos else eos if eos is not None else 0)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), pad_token_id=pad, **kwargs)
    return out[0, ids.shape[1] :].tolist()
