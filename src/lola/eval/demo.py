"""A model-free recall demo: can one attention head find a needle in a repetitive haystack?

The haystack cycles through a few key/value pairs (like RULER's repeated noise sentences),
which a linear state memorises well; the needle is one new pair at a given depth. The last
query is the needle's key. The compressed methods mix with the ``lola_authors`` rule (the
unshifted softmax sum dominates when an exact key matches, which suits an untrained map). We report the fraction of trials in which the head's output
points at the needle's value (cosine > 0.9), and the exact-memory budget each method uses.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated

import torch
from pydantic import Field, Strict

from lola.config import LoLAConfig
from lola.layer import compose
from lola.limits import MAX_TOKENS
from lola.methods import METHODS, method_config

__all__ = ["MAX_LENGTH", "MAX_TRIALS", "DemoResult", "check_demo_args", "run_demo"]


@dataclass
class DemoResult:
    """One row of the demo table."""

    method: str
    recall: float
    exact_tokens: int
    state_bytes: int
    seconds: float


def _haystack(length: int, head_dim: int, vocab: int, depth: float, gen: torch.Generator):
    # Keys of norm 3·√D make φ(k) = [softmax(k), softmax(−k)] peaked, so distinct keys barely
    # collide and the repeated haystack is recalled well by the linear state.
    keys = torch.nn.functional.normalize(torch.randn(vocab + 1, head_dim, generator=gen), dim=-1) * 3 * head_dim**0.5
    values = torch.randn(vocab + 1, head_dim, generator=gen)
    ids = torch.arange(length) % vocab
    ids[int(depth * (length - 2)) + 1] = vocab  # the needle
    k, v = keys[ids], values[ids]
    q = k.clone()
    q[-1] = keys[vocab]  # the last query asks for the needle's key (its own k/v are haystack)
    # [B=1, T, H=1, D]
    return q[None, :, None], k[None, :, None], v[None, :, None], values[vocab]


MIN_BUDGET = 8
"""Smallest exact budget: the LoLA variants keep 4 sinks, a sparse cache of ``budget // 2``
tokens and a window of the rest; ``window`` and ``hybrid`` keep 4 sinks and a window of the rest."""

MAX_LENGTH = 2**14
"""Longest trial: the ``full`` method scores every pair of tokens at once, ``length²`` floats
(its peak memory grows with the square of the length: docs/results.md, "The demo"), far below
:data:`lola.limits.MAX_TOKENS`, which bounds one memory rather than a quadratic score matrix."""
MAX_TRIALS = 1_000_000
"""Most needle depths (time grows with them; a bound catches a typo such as ``10**12``)."""
MAX_SEED = 2**63
"""Seeds are ints in ``-MAX_SEED <= seed < MAX_SEED``: what :func:`torch.manual_seed` takes without
overflowing (``lola demo``, ``lola niah`` and ``lola linearize`` share the bound)."""
Seed = Annotated[int, Strict(), Field(ge=-MAX_SEED, lt=MAX_SEED)]
"""A seed in a pydantic schema: an int (no bool or float), ``-2**63 <= seed < 2**63``."""

DEMO_POLICIES = ("sre", "recency", "random")
"""The scoring policies the demo's ``lola`` method runs with (``lola-<policy>``)."""


def check_demo_args(length: object, trials: object, budget: object, prefix: str = "", seed: object = 0) -> None:
    """Refuse demo settings that cannot run or would say nothing.

    ``length``, ``trials``, ``budget`` and ``seed`` must be ints (``seed`` in ``-2**63 <= seed < 2**63``,
    what :func:`torch.manual_seed` takes); ``length`` at most :data:`MAX_LENGTH`
    (and :data:`lola.limits.MAX_TOKENS`), ``trials`` at most :data:`MAX_TRIALS`; ``budget`` at
    least :data:`MIN_BUDGET` and smaller than ``length`` (with the whole haystack exact, every
    method trivially recalls the needle). ``prefix`` goes before each name in the message
    (``"--"`` for the command line).

    Raises:
        ValueError: naming the first bad argument.
    """
    longest = min(MAX_LENGTH, MAX_TOKENS)
    for name, value, minimum, maximum in (
        ("length", length, MIN_BUDGET + 1, longest),
        ("trials", trials, 1, MAX_TRIALS),
        ("budget", budget, MIN_BUDGET, None),  # bounded by length, below
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            why = " (4 sinks, a window and a sparse cache)" if name == "budget" else ""
            raise ValueError(f"{prefix}{name} must be an int >= {minimum}{why}, got {value!r}")
        if maximum is not None and value > maximum:
            why = f" (the full method scores {prefix}length² token pairs at once)" if name == "length" else ""
            raise ValueError(f"{prefix}{name} must be <= {maximum}{why}, got {value}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not -MAX_SEED <= seed < MAX_SEED:
        raise ValueError(f"{prefix}seed must be an int in -2**63 .. 2**63 - 1 (a torch seed), got {seed!r}")
    if budget >= length:
        raise ValueError(
            f"{prefix}budget ({budget}) must be smaller than {prefix}length ({length}): with every token exact, all methods find the needle and the demo shows nothing"
        )


def run_demo(length: int = 2048, trials: int = 8, budget: int = 128, head_dim: int = 64, vocab: int = 4, seed: int = 0) -> list[DemoResult]:
    """Run every method (:mod:`lola.methods`; ``lola`` once per policy of :data:`DEMO_POLICIES`)
    on the same trials and return one :class:`DemoResult` per method.

    Args:
        length: tokens per trial.
        trials: needles at evenly spread depths.
        budget: exact tokens (sinks + window + sparse) for the LoLA variants.
        head_dim: ``D``.
        vocab: distinct haystack pairs.
        seed: RNG seed.

    Raises:
        ValueError: see :func:`check_demo_args`.
    """
    check_demo_args(length, trials, budget, seed=seed)
    half = budget // 2
    settings = dict(window=budget - 4 - half, sparse_size=half, sinks=4, chunk=half, mixing="lola_authors")
    methods: dict[str, LoLAConfig] = {}
    for method in METHODS:
        if method == "full":  # stock attention: one head with every token exact
            methods["full"] = LoLAConfig(window=length, sparse_size=0, sinks=0, chunk=length)
        elif method == "lola":
            for policy in DEMO_POLICIES:
                methods[f"lola-{policy}"] = method_config("lola", policy=policy, **settings)
        else:
            methods[method] = method_config(method, **settings)
    results = []
    for name, cfg in methods.items():
        attn = compose(cfg, num_heads=1, head_dim=head_dim)
        gen = torch.Generator().manual_seed(seed)
        hits, nbytes, t0 = 0, 0, time.perf_counter()
        for i in range(trials):
            q, k, v, target = _haystack(length, head_dim, vocab, (i + 0.5) / trials, gen)
            with torch.no_grad():
                o, state = attn(q, k, v)
            hits += int(torch.cosine_similarity(o[0, -1, 0], target, dim=0) > 0.9)
            nbytes = state.nbytes()
        exact = length if name == "full" else cfg.exact_budget
        results.append(DemoResult(name, hits / trials, exact, nbytes, time.perf_counter() - t0))
    return results


def format_table(results: list[DemoResult]) -> str:
    """A plain-text table of demo results."""
    lines = [f"{'method':<14}{'recall':>8}{'exact tokens':>14}{'state bytes':>14}{'seconds':>9}"]
    for r in results:
        lines.append(f"{r.method:<14}{r.recall:>8.0%}{r.exact_tokens:>14}{r.state_bytes:>14,}{r.seconds:>9.2f}")
    return "\n".join(lines)
