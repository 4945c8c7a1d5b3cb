#!/usr/bin/env python
"""``LOLA_KERNELS=compiled`` against ``auto`` on the model ``lola niah`` runs, one process.

    python benchmarks/compile_ab.py [--tokens 4096] [--decode 64] [--rounds 3] [--threads N]

The linearized SmolLM2 with the default ``lola-learned`` method of ``lola niah`` (the shipped
maps, the paper's rule, calibrated budgets, bounded positions) reads with the fused CPU forms
of its ops eagerly (``auto``) and compiled by ``torch.compile`` (``compiled``,
:mod:`lola.kernels.decoding.compiled`): one prefill of ``--tokens`` tokens of the noise haystack, then
``--decode`` greedy tokens, on a fresh cache each time. Stock attention (SDPA + DynamicCache)
on the same tokens is timed first in the same process, as the baseline of both. Each backend
is warmed up once (the compiled one compiles there; its time is printed), then the two are
timed alternately ``--rounds`` times; the best round of each is reported, with the others.
Machines are noisy: compare ratios of one run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import apply_threads, niah_lola_config, noise_ids  # noqa: E402

import lola  # noqa: E402
from lola.integrations.transformers import LoLACache, apply_lola  # noqa: E402
from lola.kernels import use_backend  # noqa: E402


def timed(model, ids: torch.Tensor, make_cache, decode: int) -> tuple[float, float]:
    """``(prefill tokens/s, ms per decoded token)`` of one prefill and ``decode`` greedy tokens."""
    with torch.inference_mode():
        cache = make_cache()
        t0 = time.perf_counter()
        out = model(ids, cache=cache)
        prefill = time.perf_counter() - t0
        token = out.logits[:, -1:].argmax(-1)
        t0 = time.perf_counter()
        for _ in range(decode):
            token = model(token, cache=cache).logits[:, -1:].argmax(-1)
        per_token = (time.perf_counter() - t0) / max(decode, 1)
    return ids.shape[1] / prefill, per_token * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=4096, help="prefill tokens")
    parser.add_argument("--decode", type=int, default=64, help="decoded tokens after the prefill")
    parser.add_argument("--rounds", type=int, default=3, help="alternating timed rounds of the two backends")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args()
    apply_threads(args)
    from lola.pretrained.folder import read_feature_maps

    model, tok = lola.models.load("smollm2-135m-instruct")
    ids = noise_ids(tok, args.tokens)
    method, cfg = niah_lola_config("smollm2-135m-instruct", "smollm2-135m-instruct", "learned", args.tokens)
    timed(model, ids, DynamicCache, 2)  # warm-up
    stock = timed(model, ids, DynamicCache, args.decode)
    apply_lola(model, cfg, feature_maps=read_feature_maps("smollm2-135m-instruct"))
    make_cache = lambda: LoLACache(model)  # noqa: E731
    results: dict[str, list[tuple[float, float]]] = {"auto": [], "compiled": []}
    for name in results:
        t0 = time.perf_counter()
        with use_backend(name):
            timed(model, ids, make_cache, max(args.decode, 2))
        print(f"{name}: warm-up {time.perf_counter() - t0:.1f} s", flush=True)
    for _ in range(args.rounds):
        for name, rounds in results.items():
            with use_backend(name):
                rounds.append(timed(model, ids, make_cache, args.decode))
    print(
        f"\n{method}, {args.tokens} tokens, {args.decode} decoded, {torch.get_num_threads()} threads; stock attention: {stock[0]:.0f} tokens/s prefill, {stock[1]:.1f} ms/token"
    )
    print("| backend | prefill tokens/s | × stock | ms/token | stock's ms/token ÷ this | rounds (tokens/s; ms/token) |")
    print("|---|---:|---:|---:|---:|---|")
    for name, rounds in results.items():
        best_prefill, best_decode = max(r[0] for r in rounds), min(r[1] for r in rounds)
        every = "; ".join(f"{p:.0f}, {d:.1f}" for p, d in rounds)
        print(f"| {name} | {best_prefill:.0f} | {best_prefill / stock[0]:.2f} | {best_decode:.1f} | {stock[1] / best_decode:.2f} | {every} |")


if __name__ == "__main__":
    main()
