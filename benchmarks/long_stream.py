"""Cost against length past the model's context: LoLA with bounded positions on the shipped
linearized SmolLM2, one stream grown to 64K tokens, against stock attention in the same process
up to the model's context (stock refuses the rest).

    python benchmarks/long_stream.py [--contexts 4096 16384 32768 65536] [--decode 16]

LoLA runs the default ``lola niah`` config (learned scorer, calibrated budgets, the maps' read
defaults) with ``positions="bounded"``. The stream (the noise haystack's sentence) is prefilled
in 1,024-token segments; at each context ``--decode`` greedy tokens are timed one by one. Prints
per context: prefill tokens/s of the last segment, decode ms/token, cache bytes and the process's
peak RSS so far (it only grows: the peak at 64K covers everything before it); then LoLA at the
largest context against its own at the smallest, and against stock at the contexts both reach.
"""

from __future__ import annotations

import argparse
import resource
import sys
from pathlib import Path

import torch
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generate import noise_stream, run, stock_bytes  # noqa: E402

import lola  # noqa: E402
from lola.integrations.transformers import LoLACache, apply_lola, remove_lola  # noqa: E402


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", type=int, nargs="+", default=[4096, 16384, 32768, 65536])
    parser.add_argument("--decode", type=int, default=16, help="greedy tokens timed at each context length")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    args = parser.parse_args()
    contexts = sorted(args.contexts)
    model, tok = lola.models.load(args.model)
    ids = noise_stream(tok, contexts, args.decode)
    limit = model.config.max_position_embeddings

    from lola.eval.niah_spec import NiahRun, method_configs

    cfg = method_configs(NiahRun(model=args.model, methods=["lola"], policies=["learned"], positions="bounded"))["lola-learned"]
    apply_lola(model, cfg, feature_maps=args.model)
    c = model._lola.config
    print(f"lola (bounded: exact_distance {c.exact_distance}, state_positions {c.state_positions}; policy {c.policy}, mixing {c.mixing})")
    rss: list[float] = []
    lola_rows = run(model, ids, contexts, args.decode, lambda: LoLACache(model), lambda cache: cache.nbytes(), after=lambda: rss.append(peak_rss_mib()))
    remove_lola(model)
    inside = [n for n in contexts if n <= limit]
    stock_rows = []
    if inside:
        print(f"stock transformers (SDPA + DynamicCache), up to the model's {limit} positions")
        stock_rows = run(model, ids, inside, args.decode, DynamicCache, stock_bytes)

    print("\n| context | lola prefill tok/s | lola ms/token | lola cache MiB | peak RSS MiB | stock prefill tok/s | stock ms/token | stock cache MiB |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    stock = {r[0]: r for r in stock_rows}
    for (n, ms, nbytes, prefill), peak in zip(lola_rows, rss):
        s = stock.get(n)
        tail = f"{s[3]:.0f} | {s[1]:.1f} | {s[2] / 2**20:.1f}" if s else "refused | refused | refused"
        print(f"| {n} | {prefill:.0f} | {ms:.1f} | {nbytes / 2**20:.1f} | {peak:.0f} | {tail} |")
    first, last = lola_rows[0], lola_rows[-1]
    print(
        f"\nlola at {last[0]} vs its own at {first[0]}: prefill {last[3] / first[3]:.2f}x the tokens/s, decode {last[1] / first[1]:.2f}x the ms/token, "
        f"cache {last[2] / first[2]:.3f}x the bytes, peak RSS {rss[-1] / rss[0]:.3f}x"
    )
    for n, ms, nbytes, prefill in lola_rows:
        if n in stock:
            s = stock[n]
            print(f"at {n}: lola prefill {prefill / s[3]:.2f}x stock's tokens/s, decode {s[1] / ms:.2f}x as fast, cache {s[2] / nbytes:.1f}x smaller")


if __name__ == "__main__":
    with torch.inference_mode():
        main()
