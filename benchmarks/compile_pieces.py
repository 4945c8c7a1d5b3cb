#!/usr/bin/env python
"""Pieces of the engine's step eager against ``torch.compile(dynamic=True)``, one process.

    python benchmarks/compile_pieces.py [--threads 1] [--repeats 5]

Each piece is a pure tensor function of the select step or the decode step, timed on random
inputs of the shapes the default ``lola niah`` gives it on SmolLM2-135M (9 query heads, 3 K/V
heads, head size 64; ragged budgets of up to 1,323 slots a head):

- ``hedgehog``: the key feature map (``[B, 9, N, 64] -> [B, 9, N, 128]``), on the 256 keys a
  prefill step folds and on the 4,096 queries of a 4K prefill;
- ``repeats``: the repeat test of the ``distinct`` policy (:func:`lola.policies.combinators.repeats`'s
  dense form) over one head's candidates (256 leaving the window + its sparse slots);
- ``decode``: one decode step's arithmetic (:func:`lola.kernels.decoding.fused.decode_core`),
  under its layouts of the calibrated budgets.

Each line: the best of ``--repeats`` loops, eager and compiled, and the largest difference of
their outputs. Compilation happens before timing (its seconds are printed per piece).
"""

from __future__ import annotations

import argparse
import time

import torch

from lola.feature_maps.hedgehog import HedgehogFeatureMap
from lola.kernels.decoding import fused
from lola.kernels.exact_attention.reference import _slot_heads
from lola.policies.combinators import _repeats_dense


def best_us(fn, repeats: int, loops: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(loops):
            fn()
        best = min(best, (time.perf_counter() - t0) / loops)
    return best * 1e6


def compare(name: str, eager, args: tuple, repeats: int, loops: int) -> None:
    compiled = torch.compile(eager, dynamic=True)
    t0 = time.perf_counter()
    out = compiled(*args)
    first = time.perf_counter() - t0
    want = eager(*args)
    diff = (want.float() - out.float()).abs().max().item() if want.is_floating_point() else float((want != out).sum())
    e, c = best_us(lambda: eager(*args), repeats, loops), best_us(lambda: compiled(*args), repeats, loops)
    print(f"| {name} | {e:.0f} | {c:.0f} | {e / c:.2f} | {first:.1f} | {diff:.1e} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"{torch.get_num_threads()} thread(s); µs per call, best of {args.repeats} loops\n")
    print("| piece | eager µs | compiled µs | eager ÷ compiled | first call s | max difference |")
    print("|---|---:|---:|---:|---:|---:|")
    maps = HedgehogFeatureMap(9, 64, 64, identity=True).eval()
    with torch.inference_mode():
        for n in (256, 4096):
            compare(f"hedgehog, [1, 9, {n}, 64]", maps.forward, (torch.randn(1, 9, n, 64),), args.repeats, 20)
        for n in (448, 1000, 1579):
            v = torch.randn(1, 1, n, 64)
            v[..., n // 2 :, :] = v[..., : n - n // 2, :] + 0.01 * torch.randn(1, 1, n - n // 2, 64)  # half are near-copies
            pieces = (v, torch.randn(1, 1, n), torch.randperm(n)[None, None], torch.ones(1, 1, n, dtype=torch.bool), 0.95, 4)
            compare(f"repeats, {n} candidates", _repeats_dense, pieces, args.repeats, 10)
        for widths in ((57, 61, 53), (136, 57, 1323), (719, 334, 1134)):
            B, N, S = 1, 128, sum(widths)
            offsets = tuple(sum(widths[:i]) for i in range(4))
            step = (
                torch.randn(B, 9, 64),
                torch.randn(B, 3, N, 64),
                torch.randn(B, 3, N, 64),
                torch.arange(N).expand(B, 3, N).clone(),
                torch.rand(B, 9, 128),
                torch.randn(B, 9, 128, 64),
                torch.rand(B, 9, 128),
                torch.rand(9),
                "lola_authors",
                0.125,
                (torch.randn(B, S, 64), torch.randn(B, S, 64), torch.arange(S).expand(B, S).clone(), _slot_heads(offsets, torch.device("cpu"))),
                torch.full((B,), 0.05),
            )
            compare(f"decode step, ragged {list(widths)}", fused.decode_core, step, args.repeats, 200)


if __name__ == "__main__":
    main()
