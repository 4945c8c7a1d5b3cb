"""What folding repeats costs per update: :func:`lola.policies.combinators.repeats` (candidates
sorted by rank, one lower-triangular product) against its definition
:func:`~lola.policies.combinators.repeats_reference` (pairwise rank masks), on one update's
candidates of SmolLM2's geometry (3 K/V heads, head_dim 64), interleaved in one process,
median of repeats, with their ratio.

    python benchmarks/repeats.py [--candidates 320 864] [--repeats 20] [--threads 1]

``--candidates``: a sparse cache plus one 64-token chunk; 864 is about the largest head's slots
of a layer at the calibrated budgets plus a chunk (every head of a layer holds that many).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lola.policies.combinators import repeats, repeats_reference


def _ms(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidates", type=int, nargs="+", default=[320, 864])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"threads {args.threads}, 3 K/V heads, head_dim 64, threshold 0.95, median of {args.repeats}")
    print(f"{'candidates':>10} {'reference ms':>13} {'sorted ms':>10} {'ratio':>6}")
    g = torch.Generator().manual_seed(0)
    for n in args.candidates:
        v = torch.randn(1, 3, n, 64, generator=g)
        v[:, :, n // 2 :] = v[:, :, : n - n // 2] * 1.5 + 0.1 * torch.randn(1, 3, n - n // 2, 64, generator=g)  # half are near-copies
        scores = torch.randn(1, 3, n, generator=g)
        pos = torch.stack([torch.randperm(n, generator=g) for _ in range(3)]).view(1, 3, n)
        valid = torch.ones(1, 3, n, dtype=torch.bool)
        inputs = (v, scores, pos, valid, 0.95)
        assert torch.equal(repeats(*inputs), repeats_reference(*inputs))
        ref, new = [], []
        for _ in range(args.repeats):  # interleaved: both see the same machine
            ref.append(_ms(repeats_reference, *inputs))
            new.append(_ms(repeats, *inputs))
        a, b = statistics.median(ref), statistics.median(new)
        print(f"{n:>10} {a:>13.2f} {b:>10.2f} {a / b:>5.2f}x")


if __name__ == "__main__":
    main()
