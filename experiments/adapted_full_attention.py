"""Full attention on a linearized model's adapted weights: the ceiling of every exact-token method.

``lola linearize`` trains LoRA adapters on the q/k/v/o projections beside the feature maps, so
the model LoLA runs on is not the stock one. This script merges those adapters into the stock
weights and answers ``lola niah``'s prompts (same task, lengths, samples and seed: the same
prompts) with stock attention and every token kept. Where it misses, no choice of exact tokens
and no linear state can answer on these weights: the miss is the adapters' own (at 8K they run
at positions four times past the 2K they were trained at). One JSON line per sample; an
interrupted run resumes from the file.

    python experiments/adapted_full_attention.py --feature-maps smollm2-135m-instruct --lengths 8192 --samples 20 --out results/adapted-full-8k.jsonl
    python experiments/adapted_full_attention.py --feature-maps smollm2-135m-instruct --haystack-file prose.txt --lengths 4096 --samples 20 --out results/adapted-full-prose-4k.jsonl
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from lola import models
from lola.eval.niah import string_match_all
from lola.eval.niah_execution import niah_prompts
from lola.eval.niah_report import wilson_interval
from lola.eval.niah_spec import NiahRun
from lola.pretrained.folder import read_feature_maps
from lola.pretrained.lora import merge_lora


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--feature-maps", required=True, help="a `lola linearize` folder or shipped name whose LoRA adapters are merged")
    ap.add_argument("--task", default="niah_single_1")
    ap.add_argument("--lengths", type=int, nargs="+", default=[8192])
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--haystack-file", default=None, help="a text whose sentences replace the noise haystack (as `lola niah --haystack-file`)")
    ap.add_argument("--out", type=Path, required=True, help="JSON lines, one per sample (appended to: a run resumes)")
    args = ap.parse_args()

    maps = read_feature_maps(args.feature_maps)
    assert maps.lora is not None, f"{args.feature_maps} has no LoRA adapters: full attention on its weights is the stock model's (lola niah --methods full)"
    model, tok = models.load(args.model)
    merge_lora(model, maps.lora, maps.lora_spec)
    run = NiahRun(
        model=args.model, task=args.task, lengths=args.lengths, samples=args.samples, seed=args.seed, methods=["full"], haystack_file=args.haystack_file
    )
    prompts = niah_prompts(run, tok)
    done = {}
    if args.out.exists():
        for line in args.out.read_text().splitlines():
            rec = json.loads(line)
            same = rec["seed"] == args.seed and rec["task"] == args.task and rec.get("haystack_file") == args.haystack_file
            assert same, f"{args.out} holds another run's samples (seed {rec['seed']}, task {rec['task']}, haystack {rec.get('haystack_file')})"
            done[(rec["length"], rec["index"])] = rec
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as log:
        for (n, i), s in prompts.items():
            if (n, i) in done:
                continue
            t0 = time.perf_counter()
            with torch.no_grad():
                ids = model.generate(
                    s.input_ids,
                    attention_mask=torch.ones_like(s.input_ids),
                    max_new_tokens=run.new_tokens,
                    do_sample=False,
                    cache=DynamicCache(),
                    pad_token_id=pad,
                )
            prediction = tok.decode(ids[0, s.input_ids.shape[1] :], skip_special_tokens=True)
            rec = {
                "task": args.task,
                "seed": args.seed,
                "haystack_file": args.haystack_file,
                "length": n,
                "index": i,
                "depth": s.depth,
                "answers": s.answers,
                "prediction": prediction,
                "score": string_match_all(prediction, s.answers),
                "seconds": time.perf_counter() - t0,
            }
            print(f"{n} #{i} depth {s.depth:.3f}: {prediction!r} ({'right' if rec['score'] == 1 else 'wrong'})", flush=True)
            log.write(json.dumps(rec) + "\n")
            log.flush()
            done[(n, i)] = rec
    for n in args.lengths:
        scores = [done[(n, i)]["score"] for i in range(args.samples)]
        lo, hi = wilson_interval(sum(scores), len(scores))
        missed = [i for i in range(args.samples) if done[(n, i)]["score"] < 1]
        print(f"length {n}: {sum(scores):g}/{len(scores)} ({100 * sum(scores) / len(scores):.0f}% [{lo:.0f}-{hi:.0f}]); missed samples {missed}")


if __name__ == "__main__":
    main()
