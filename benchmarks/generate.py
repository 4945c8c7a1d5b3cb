"""Decode speed and cache size of LoLA vs stock transformers on SmolLM2-135M-Instruct.

    python benchmarks/generate.py [--contexts 1024 4096 8192 16384] [--decode 16] [--model NAME_OR_PATH]

For each method (stock: SDPA attention + DynamicCache; lola: apply_lola + LoLACache with
window 64, sparse 64, sinks 4, chunk 64, SRE), the context is built up by prefill in
1,024-token segments; at each context length, ``--decode`` greedy tokens are timed one by one.
Prints ms/token and cache bytes per context, then the ratios: LoLA at the largest context vs
its own at the smallest, and stock vs LoLA at the largest context.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import DynamicCache

import lola
from lola.eval.niah import NOISE
from lola.integrations.transformers import LoLACache, apply_lola, remove_lola


def stock_bytes(cache: DynamicCache) -> int:
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values) if t is not None)


def run(model, ids: torch.Tensor, contexts: list[int], decode: int, make_cache, nbytes) -> list[tuple[int, float, int]]:
    """Grow one cache through ``contexts`` (prefill from ``ids``), timing ``decode`` greedy steps at each."""
    cache, consumed, rows = make_cache(), 0, []
    with torch.inference_mode():
        for ctx in contexts:
            while cache.get_seq_length() < ctx:
                n = min(1024, ctx - cache.get_seq_length())
                logits = model(ids[:, consumed : consumed + n], cache=cache).logits
                consumed += n
            nxt = logits[:, -1:].argmax(-1)
            t0 = time.perf_counter()
            for _ in range(decode):
                logits = model(nxt, cache=cache).logits
                nxt = logits[:, -1:].argmax(-1)
            rows.append((ctx, (time.perf_counter() - t0) / decode * 1e3, nbytes(cache)))
            print(f"  {ctx:>6} tokens: {rows[-1][1]:8.1f} ms/token, {rows[-1][2] / 2**20:8.1f} MiB", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 8192, 16384])
    parser.add_argument("--decode", type=int, default=16, help="greedy tokens timed at each context length")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    contexts = sorted(args.contexts)
    model, tok = lola.models.load(args.model)
    text = "\n".join([NOISE] * (contexts[-1] // 10 + 100))
    ids = tok(text, return_tensors="pt").input_ids[:, : contexts[-1] + args.decode * len(contexts) + 8]
    if ids.shape[1] < contexts[-1]:
        raise SystemExit(f"the text tokenised to only {ids.shape[1]} tokens")

    print("stock transformers (SDPA + DynamicCache)")
    stock = run(model, ids, contexts, args.decode, DynamicCache, stock_bytes)
    cfg = lola.LoLAConfig(window=64, sparse_size=64, sinks=4, chunk=64, policy="sre")
    apply_lola(model, cfg)
    print(f"lola ({cfg.model_dump_json(include={'window', 'sparse_size', 'sinks', 'chunk', 'policy'})})")
    lola_rows = run(model, ids, contexts, args.decode, lambda: LoLACache(model), lambda c: c.nbytes())
    remove_lola(model)

    print("\n| context | stock ms/token | lola ms/token | stock cache MiB | lola cache MiB |")
    print("|---:|---:|---:|---:|---:|")
    for (c, ts, bs), (_, tl, bl) in zip(stock, lola_rows):
        print(f"| {c} | {ts:.1f} | {tl:.1f} | {bs / 2**20:.1f} | {bl / 2**20:.2f} |")
    (c0, _, _), (c1, ts1, bs1), (_, tl0, _), (_, tl1, bl1) = stock[0], stock[-1], lola_rows[0], lola_rows[-1]
    print(f"\nlola decode at {c1} vs its own at {c0}: {tl1 / tl0:.2f}x time")
    print(f"stock vs lola at {c1}: {ts1 / tl1:.2f}x faster, cache {bs1 / bl1:.1f}x smaller")


if __name__ == "__main__":
    main()
