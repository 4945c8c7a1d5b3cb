#!/usr/bin/env python
"""How many operations one LoLA layer calls per block of prefill and per decoded token.

    python benchmarks/op_count.py [--chunk 64] [--prefill-chunk 256] [--policy sre|learned|...] [--mixing softmax_only|lola_authors|lolcats]
                                  [--tokens 1024] [--decode 64] [--top 15]

On two CPU cores the engine's step is bound by the number of small operations it calls, not by
their arithmetic (docs/performance.md), so the count is the measure of a lever that fuses or
removes calls. Counts, unlike times, do not depend on what else the machine runs: a run under
load gives the same figures.

The layer is SmolLM2-135M's attention shape (9 query heads, 3 K/V heads, head size 64) with
``lola niah``'s default sizes (window 60, sparse 192, sinks 4; uniform budgets) and the given
chunk, policy and mixing rule (``hedgehog`` maps of F = 128 features, random weights); inputs
are random. Two counts per phase: the PyTorch calls made from Python (``TorchFunctionMode``:
what each costs a few microseconds of dispatch on a CPU) and the ATen operators they run
(``TorchDispatchMode``: about one kernel launch each on a GPU). Prefill: one call of
``--tokens`` tokens on a fresh state, divided by its blocks (``tokens / chunk``). Decode: after
that prefill, ``--decode`` single-token calls (a multiple of the chunk, so each step falls in
them as often as in a long decode), divided by the tokens. The most called operators are listed.
"""

from __future__ import annotations

import argparse
import collections

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import lola


class _CountFunctions(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.counts[getattr(func, "__name__", str(func))] += 1
        return func(*args, **(kwargs or {}))


class _CountOperators(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def count(fn) -> tuple[collections.Counter, collections.Counter]:
    """``(python calls, aten operators)`` made while ``fn()`` runs."""
    functions, operators = _CountFunctions(), _CountOperators()
    with torch.no_grad(), functions, operators:
        fn()
    return functions.counts, operators.counts


def layer(chunk: int, policy: str, mixing: str, prefill_chunk: int | None = None) -> lola.LoLAAttention:
    kwargs = {"policy_kwargs": {"scorer": "smollm2-135m-instruct"}} if policy == "learned" else {}
    if prefill_chunk is not None:
        kwargs["schedule_kwargs"] = {"prefill_chunk": prefill_chunk}
    cfg = lola.LoLAConfig(window=60, sparse_size=192, sinks=4, chunk=chunk, policy=policy, mixing=mixing, feature_map="hedgehog", feature_dim=64, **kwargs)
    torch.manual_seed(0)
    return lola.compose(cfg, num_heads=9, head_dim=64, num_kv_heads=3, layer=10).eval()  # (the learned scorer reads its layer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--prefill-chunk", type=int, help="tokens between steps within the prefill (a multiple of --chunk; default: --chunk)")
    parser.add_argument("--policy", default="sre")
    parser.add_argument("--mixing", default="lola_authors", choices=("softmax_only", "lola_authors", "lolcats"))
    parser.add_argument("--tokens", type=int, default=1024, help="prefill tokens (a multiple of the chunk)")
    parser.add_argument("--decode", type=int, default=64, help="decoded tokens after the prefill (a multiple of the chunk)")
    parser.add_argument("--top", type=int, default=15, help="operators listed per phase")
    args = parser.parse_args()
    attn = layer(args.chunk, args.policy, args.mixing, args.prefill_chunk)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, args.tokens + args.decode, 9, 64, generator=gen)
    k = torch.randn(1, args.tokens + args.decode, 3, 64, generator=gen)
    v = torch.randn(1, args.tokens + args.decode, 3, 64, generator=gen)
    n = args.tokens
    with torch.no_grad():
        attn(q[:, :n], k[:, :n], v[:, :n])  # warm-up (lazy imports, caches)
    box = {}

    def prefill():
        box["state"] = attn(q[:, :n], k[:, :n], v[:, :n])[1]

    def decode():
        state = box["state"]
        for t in range(n, n + args.decode):
            _, state = attn(q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], state=state)

    block = args.prefill_chunk or args.chunk
    prefill_chunk = f", prefill chunk {args.prefill_chunk}" if args.prefill_chunk else ""
    print(f"one layer (H=9, H_kv=3, D=64; window 60, sparse 192, sinks 4, chunk {args.chunk}{prefill_chunk}, {args.policy}, {args.mixing})")
    for name, fn, per, unit in (("prefill", prefill, n / block, f"per {block}-token block"), ("decode", decode, args.decode, "per token")):
        functions, operators = count(fn)
        print(f"\n{name}: {sum(functions.values()) / per:.0f} PyTorch calls and {sum(operators.values()) / per:.0f} ATen operators {unit}")
        print("  most called operators: " + ", ".join(f"{op.split('.')[-1]} {c / per:.1f}" for op, c in operators.most_common(args.top)))


if __name__ == "__main__":
    main()
