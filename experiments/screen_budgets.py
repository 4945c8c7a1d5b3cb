"""Screen LoLA budget allocations and policies on *tuning* samples (not the reported ones).

``lola niah`` reports on samples drawn with ``--seed 0``; this script draws its prose
pass-key prompts with seed 1 (other keys, values, depths and haystack offsets), so that the
choices made here are not tuned on the samples the results report. Every variant keeps 256
exact tokens per K/V head on average (sinks + window + mean sparse size).

Variants (``kind:option=value:...``):

- ``uniform[:sinks=S][:window=W][:policy=P]``: the same sparse size in every head;
- ``cal[:power=X][:floor=F][:sinks=S][:window=W][:p=PRESET]``: the shipped SmolLM2 scores
  (``lola calibrate``) allocated with ``lola.budgets.allocate``;
- ``top:k=K[:size=N]``: N sparse slots in the K best-scored heads, none elsewhere
  (a diagnostic: it may exceed the bytes).

    python experiments/screen_budgets.py --samples 12 --variants uniform cal cal:power=0.3 top:k=8
"""

from __future__ import annotations

import argparse
import time

import torch

import lola
from lola.budgets import allocate
from lola.eval.niah import make_sample, string_match_all
from lola.integrations.transformers import LoLACache, apply_lola, remove_lola

PRESETS = {
    "ea": ("expected_attention", {"rope_theta": 1e5}),
    "span": ("span", {"policy": "sre", "radius": 3}),
    "fuse": ("fusion", {"policies": ["sre", "expected_attention"], "kwargs": [{}, {"rope_theta": 1e5}]}),
}


def variant_config(name: str, scores: torch.Tensor) -> lola.LoLAConfig:
    kind, *parts = name.split(":")
    opts = dict(p.split("=") for p in parts)
    sinks, window = int(opts.get("sinks", 4)), int(opts.get("window", 60))
    per_head = 256 - sinks - window
    policy, kwargs = PRESETS[opts["p"]] if "p" in opts else (opts.get("policy", "sre"), {})
    base = dict(window=window, sparse_size=per_head, sinks=sinks, chunk=64, mixing="softmax_only", policy=policy, policy_kwargs=kwargs)
    if kind == "uniform":
        return lola.LoLAConfig(**base)
    if kind == "cal":
        sizes = allocate(scores, per_head, power=float(opts.get("power", 0.5)), floor=int(opts.get("floor", 0)))
    elif kind == "top":
        sizes = torch.zeros(scores.numel(), dtype=torch.long)
        sizes[scores.flatten().argsort(descending=True)[: int(opts.get("k", 8))]] = int(opts.get("size", 2048))
        sizes = sizes.view_as(scores)
    else:
        raise SystemExit(f"unknown variant kind {kind!r}")
    print(f"{name}: {int(sizes.sum())} sparse slots (uniform: {per_head * scores.numel()}), largest head {int(sizes.max())}")
    return lola.LoLAConfig(**base, layer_overrides={i: {"sparse_size_per_head": row.tolist()} for i, row in enumerate(sizes)})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="+", required=True)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--samples", type=int, default=12)
    ap.add_argument("--seed", type=int, default=1, help="1: tuning samples (lola niah reports seed 0)")
    ap.add_argument("--haystack-file", default=None, help="default: pydoc_data.topics")
    ap.add_argument("--full", action="store_true", help="also run full attention")
    args = ap.parse_args()
    if args.haystack_file:
        haystack = open(args.haystack_file).read()
    else:
        from pydoc_data.topics import topics

        haystack = " ".join(topics.values())
    model, tok = lola.models.load("smollm2-135m-instruct")
    scores = torch.tensor(lola.budgets.load("smollm2-135m-instruct").scores)
    prompts = [
        make_sample(tok, "niah_single_1", args.length, (i + 0.5) / args.samples, seed=args.seed * 100_003 + i, max_new_tokens=12, haystack=haystack)
        for i in range(args.samples)
    ]
    for name in (["full"] if args.full else []) + args.variants:
        cfg = None if name == "full" else variant_config(name, scores)
        if cfg is not None:
            apply_lola(model, cfg)
        t0, hits, misses = time.perf_counter(), 0.0, []
        try:
            for s in prompts:
                kw = {} if cfg is None else {"cache": LoLACache(model)}
                with torch.no_grad():
                    ids = model.generate(s.input_ids, max_new_tokens=12, do_sample=False, pad_token_id=tok.eos_token_id, **kw)
                prediction = tok.decode(ids[0, s.length :], skip_special_tokens=True)
                score = string_match_all(prediction, s.answers)
                hits += score
                if score < 1:
                    misses.append(prediction[:14])
        finally:
            if cfg is not None:
                remove_lola(model)
        print(f"{name:32s} {hits:.0f}/{len(prompts)}  {time.perf_counter() - t0:.0f}s  misses: {misses[:4]}", flush=True)


if __name__ == "__main__":
    main()
