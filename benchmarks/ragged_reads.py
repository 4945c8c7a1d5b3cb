#!/usr/bin/env python
"""The two forms of a ragged read on this machine: masked (every query head scores the whole run)
against head by head (each its own range), at the run widths of calibrated budgets.

    python benchmarks/ragged_reads.py [--budgets smollm2-135m-instruct] [--layers 0 7 21] [--queries 1 16 64]

For each layer's per-head sparse sizes (``--budgets``: a shipped name, a ``lola calibrate``
file, or the feature maps' own with ``--feature-maps``) and each number of queries, times both
forms of :func:`lola.kernels.exact_attention.reference.partials_with_ragged` in this process
(SmolLM2's heads: 9 query heads over 3 K/V heads, D = 64, 68 dense slots), prints their ratio
and the form the dispatch picks (:data:`~lola.kernels.exact_attention.reference.RAGGED_BY_HEAD_WORK`),
and checks the two agree.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # without an install
from lola.kernels.exact_attention import reference as ref  # noqa: E402
from lola.kernels.ragged import RaggedSlots  # noqa: E402


def case(widths: list[int], queries: int, heads: int = 9, dim: int = 64, dense: int = 68, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hs, s = len(widths), sum(widths)
    q = torch.randn(1, heads, queries, dim, generator=g)
    k, v = torch.randn(1, hs, dense, dim, generator=g), torch.randn(1, hs, dense, dim, generator=g)
    k_pos = torch.arange(dense).expand(1, hs, dense).contiguous()
    q_pos = None if queries == 1 else (torch.arange(queries) + 4 * s).expand(1, queries).contiguous()
    offsets = [0]
    for w in widths:
        offsets.append(offsets[-1] + w)
    run = RaggedSlots(torch.randn(1, s, dim, generator=g), torch.randn(1, s, dim, generator=g), torch.randint(0, 4 * s, (1, s), generator=g), tuple(offsets))
    return (q, k, v, q_pos, k_pos, dim**-0.5, run)


def median_ms(fn, args, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn(*args)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budgets", default="smollm2-135m-instruct", help="a shipped name or a `lola calibrate` file")
    p.add_argument("--feature-maps", help="use the budgets these maps carry (a shipped name or folder) instead")
    p.add_argument("--layers", type=int, nargs="+", default=[0, 7, 17, 21])
    p.add_argument("--queries", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.feature_maps:
        from lola.pretrained.resolve import maps_budgets

        budgets = maps_budgets(args.feature_maps)
        if budgets is None:
            raise SystemExit(f"the feature maps {args.feature_maps!r} carry no budgets")
    else:
        from lola import budgets as head_budgets

        budgets = head_budgets.load(args.budgets)
    print(f"{'layer':>5} {'widths':>18} {'queries':>7} {'masked ms':>10} {'by head ms':>10} {'ratio':>6}  picked")
    for layer in args.layers:
        widths = budgets.sparse_size_per_head[layer]
        for n in args.queries:
            a = case(widths, n)
            masked = median_ms(ref.partials_ragged_masked, a, args.warmup, args.repeats)
            by_head = median_ms(ref.partials_ragged_by_head, a, args.warmup, args.repeats)
            for x, y in zip(ref.partials_ragged_masked(*a), ref.partials_ragged_by_head(*a)):
                torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
            work = 9 * n * sum(widths) * (len(widths) - 1) // len(widths)
            picked = "by head" if work >= ref.RAGGED_BY_HEAD_WORK else "masked"
            print(f"{layer:>5} {str(widths):>18} {n:>7} {masked:>10.3f} {by_head:>10.3f} {by_head / masked:>6.2f}  {picked}")


if __name__ == "__main__":
    main()
