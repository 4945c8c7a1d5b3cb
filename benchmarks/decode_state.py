"""Decode cost and state size do not grow with context: per-token time and ``state.nbytes()``
after 1K, 8K and 32K tokens seen (B=1, H=8, D=64, window = sparse = 64, chunk 64, SRE).

    python benchmarks/decode_state.py [--contexts 1024 8192 32768] [--decode 128] [--repeats 3]

Decoding ``--decode`` tokens covers whole chunks, so the select-and-evict steps are in the
average. Prints a table and the ratios of the largest context to the smallest.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import lola


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 8192, 32768])
    parser.add_argument("--decode", type=int, default=128, help="tokens decoded (timed) after each context")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per context (median)")
    parser.add_argument("--policy", default="sre")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    b, h, d = 1, 8, 64
    cfg = lola.LoLAConfig(window=64, sparse_size=64, sinks=4, chunk=64, policy=args.policy)
    attn = lola.compose(cfg, num_heads=h, head_dim=d)
    gen = torch.Generator().manual_seed(0)
    rand = lambda t: torch.randn(b, t, h, d, generator=gen)  # noqa: E731

    rows = []
    state, seen = None, 0
    with torch.inference_mode():
        for ctx in sorted(args.contexts):
            # Feed the context in prefill segments (chunk-parallel), then time decoding.
            while seen < ctx:
                n = min(4096, ctx - seen)
                _, state = attn(rand(n), rand(n), rand(n), state=state)
                seen += n
            times = []
            for _ in range(args.repeats):
                snap = {k: x.clone() for k, x in state.state_dict().items()}
                toks = [(rand(1), rand(1), rand(1)) for _ in range(args.decode)]
                t0 = time.perf_counter()
                for q, k, v in toks:
                    _, state = attn(q, k, v, state=state)
                times.append((time.perf_counter() - t0) / args.decode)
                state.load_state_dict(snap)  # every repeat decodes from the same context
            rows.append((ctx, statistics.median(times) * 1e3, state.nbytes()))

    print(f"LoLA decode, B={b} H={h} D={d}, {cfg.model_dump_json(include={'window', 'sparse_size', 'sinks', 'chunk', 'policy'})}")
    print(f"{'context':>8} {'ms/token':>10} {'state bytes':>12}")
    for ctx, ms, nbytes in rows:
        print(f"{ctx:>8} {ms:>10.3f} {nbytes:>12,}")
    (c0, t0, b0), (c1, t1, b1) = rows[0], rows[-1]
    print(f"ratio {c1}/{c0}: time {t1 / t0:.2f}, state bytes {b1 / b0:.2f}")


if __name__ == "__main__":
    main()
