"""What a scoring policy costs on decode: ms per decoded token of one LoLA layer with SmolLM2's
geometry (9 query heads, 3 K/V heads, head_dim 64; window 60, sparse 192, 4 sinks, chunk 64)
after a prefill, for each policy, and its ratio to ``recency`` (whose score is the position:
no work), measured in the same process, interleaved, median of repeats.

    python benchmarks/policy_cost.py [--policies recency sre learned] [--scorer smollm2-135m-instruct]
        [--context 2048] [--decode 256] [--repeats 5]

Decoding ``--decode`` tokens covers whole chunks, so the select-and-evict steps (where a policy
runs) are in the average.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import lola


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", nargs="+", default=["recency", "sre", "learned"])
    parser.add_argument("--scorer", default="smollm2-135m-instruct", help="the learned policy's scorer (shipped name or file)")
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--decode", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    b, h, hkv, d = 1, 9, 3, 64
    gen = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(b, args.context, h, d, generator=gen),
        torch.randn(b, args.context, hkv, d, generator=gen),
        torch.randn(b, args.context, hkv, d, generator=gen),
    )
    steps = [
        (torch.randn(b, 1, h, d, generator=gen), torch.randn(b, 1, hkv, d, generator=gen), torch.randn(b, 1, hkv, d, generator=gen)) for _ in range(args.decode)
    ]
    layers, states = {}, {}
    with torch.inference_mode():
        for name in args.policies:
            kwargs = {"scorer": args.scorer} if name == "learned" else {}
            cfg = lola.LoLAConfig(window=60, sparse_size=192, sinks=4, chunk=64, mixing="softmax_only", policy=name, policy_kwargs=kwargs)
            layers[name] = lola.compose(cfg, num_heads=h, head_dim=d, num_kv_heads=hkv, layer=17)
            _, states[name] = layers[name](q, k, v)
        times: dict[str, list[float]] = {n: [] for n in args.policies}
        for _ in range(args.repeats):
            for name in args.policies:  # interleaved: drift hits every policy alike
                snap = {key: x.clone() for key, x in states[name].state_dict().items()}
                t0 = time.perf_counter()
                st = states[name]
                for qs, ks, vs in steps:
                    _, st = layers[name](qs, ks, vs, state=st)
                times[name].append((time.perf_counter() - t0) * 1e3 / args.decode)
                states[name].load_state_dict(snap)
    base = statistics.median(times[args.policies[0]])
    print(
        f"one layer, context {args.context}, {args.decode} decoded tokens, median of {args.repeats} (torch {torch.__version__}, {torch.get_num_threads()} threads)"
    )
    print(f"{'policy':>10}  {'ms/token':>9}  {'ratio to ' + args.policies[0]:>18}")
    for name in args.policies:
        t = statistics.median(times[name])
        print(f"{name:>10}  {t:>9.3f}  {t / base:>18.3f}")


if __name__ == "__main__":
    main()
