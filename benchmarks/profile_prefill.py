"""Where one prefill of SmolLM2 goes: cProfile of a single forward over ``--tokens`` tokens.

    python benchmarks/profile_prefill.py [--config uniform|calibrated|small|stock] [--tokens 1024] [--top 30]
    python benchmarks/profile_prefill.py --feature-maps smollm2-135m-instruct --policy learned --tokens 2048

The model and the LoLA configs are those of ``benchmarks/generate.py`` (``uniform``: window
60, sparse 192, sinks 4, chunk 64, SRE; ``stock``: SDPA + DynamicCache). With
``--feature-maps``, the linearized model as the default ``lola niah`` runs its ``lola-<policy>``
method (the shipped maps, the paper's rule, calibrated budgets), timed first against stock
attention on the same tokens (one unprofiled forward each, same process). One warm-up
forward, then one profiled forward on a fresh cache; prints the tokens/s of the profiled call
(slowed by the profiler), the functions by own time, and lola's functions by cumulative time
(the engine's parts: select-and-evict, reads, fold, writes). With ``--decode N``, then ``N``
greedy tokens decoded on the prefill's cache are profiled the same way (after one unprofiled
token).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import niah_lola_config, noise_ids  # noqa: E402
from generate import lola_config  # noqa: E402

import lola  # noqa: E402
from lola.integrations.transformers import LoLACache, apply_lola  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=("uniform", "calibrated", "small", "stock"), default="uniform")
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--top", type=int, default=30, help="rows of each table")
    parser.add_argument("--feature-maps", help="profile the linearized model as `lola niah` runs it (a shipped name or folder)")
    parser.add_argument("--policy", default="learned", help="with --feature-maps: the lola method's policy")
    parser.add_argument("--decode", type=int, default=0, help="also profile this many decoded tokens after the prefill")
    args = parser.parse_args()
    model, tok = lola.models.load(args.model)
    ids = noise_ids(tok, args.tokens)
    if args.feature_maps:
        from lola.pretrained.folder import read_feature_maps

        method, cfg = niah_lola_config(args.model, args.feature_maps, args.policy, args.tokens)
        stock = _seconds(lambda: model(ids, cache=DynamicCache()))
        apply_lola(model, cfg, feature_maps=read_feature_maps(args.feature_maps))
        lola_s = _seconds(lambda: model(ids, cache=LoLACache(model)))
        print(f"{method}: {lola_s:.2f} s, stock attention {stock:.2f} s: {stock / lola_s:.2f}x stock's tokens/s ({ids.shape[1]} tokens)")
        args.config = method
        make_cache = lambda: LoLACache(model)  # noqa: E731
    elif args.config == "stock":
        make_cache = DynamicCache
    else:
        apply_lola(model, lola_config(args.config, args.model))
        make_cache = lambda: LoLACache(model)  # noqa: E731

    box = {}

    def prefill() -> None:
        with torch.inference_mode():
            box["cache"] = make_cache()
            box["token"] = model(ids, cache=box["cache"]).logits[:, -1:].argmax(-1)

    def decode(steps: int) -> None:
        with torch.inference_mode():
            for _ in range(steps):
                box["token"] = model(box["token"], cache=box["cache"]).logits[:, -1:].argmax(-1)

    prefill()  # warm-up
    _profiled(lambda: prefill(), f"{args.config}: {ids.shape[1]} tokens", args.top)
    if args.decode:
        decode(1)  # warm-up
        _profiled(lambda: decode(args.decode), f"{args.config}: {args.decode} decoded tokens after {ids.shape[1]}", args.top)


def _profiled(fn, what: str, top: int) -> None:
    """Run ``fn`` under cProfile; print its time and the functions by own and by cumulative time."""
    profiler = cProfile.Profile()
    t0 = time.perf_counter()
    profiler.runcall(fn)
    print(f"{what} in {time.perf_counter() - t0:.2f} s under the profiler")
    stats = pstats.Stats(profiler)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumtime").print_stats("lola/", top)


def _seconds(forward) -> float:
    """Seconds of one forward after a warm-up one."""
    with torch.inference_mode():
        forward()
        t0 = time.perf_counter()
        forward()
        return time.perf_counter() - t0


if __name__ == "__main__":
    main()
