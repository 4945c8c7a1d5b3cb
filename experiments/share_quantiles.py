"""The linear state's share of LoLA's outputs on text of the model's own training split.

Runs ``lola niah``'s default LoLA config for the model (``--policy``; calibrated budgets, the
trained maps' rule) over ``--chunks`` chunks of ``--length`` tokens of the training split (never
the held-out part, nor any evaluation prompt) and prints quantiles of the share ``α`` over every
layer, head and token, and each layer's 99th percentile. A quantile at the length the maps were
trained at is what ``linear_share_cap`` is calibrated from (docs/results.md, "Long context").

    python experiments/share_quantiles.py --feature-maps smollm2-135m-instruct --length 2048 --chunks 2
    python experiments/share_quantiles.py --feature-maps smollm2-135m-instruct --length 8192 --chunks 2 --positions bounded --state-key-positions spread --linear-share-cap 1
"""

from __future__ import annotations

import argparse
import json

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--feature-maps", required=True, help="a shipped name or a `lola linearize` folder")
    parser.add_argument("--policy", default="learned", help="scoring policy of the LoLA config (learned needs a shipped scorer)")
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--chunks", type=int, default=2)
    parser.add_argument("--positions", choices=("absolute", "bounded"), help="the config's positions (default: the maps' read default)")
    parser.add_argument("--state-positions", type=int, help="with bounded positions: the limit of the state's positions (default: the maps' own)")
    parser.add_argument("--state-key-positions", choices=("clamped", "spread"), help="with bounded positions: where the state's keys enter the maps")
    parser.add_argument("--linear-share-cap", type=float, help="the config's cap (1: none; default: the maps' read default)")
    args = parser.parse_args()
    from lola import models
    from lola.data.text import encode, load_split, token_chunks
    from lola.eval.runner import NiahRun, method_configs
    from lola.integrations.transformers import LoLACache, apply_lola
    from lola.layer import observe_calls
    from lola.pretrained.folder import read_feature_maps

    model, tok = models.load(args.model)
    options = {
        "positions": args.positions,
        "state_positions": args.state_positions,
        "state_key_positions": args.state_key_positions,
        "linear_share_cap": args.linear_share_cap,
    }
    run = NiahRun(
        model=args.model, feature_maps=args.feature_maps, methods=["lola"], policies=[args.policy], **{k: v for k, v in options.items() if v is not None}
    )
    apply_lola(model, method_configs(run)[f"lola-{args.policy}"], feature_maps=read_feature_maps(args.feature_maps))
    train, _ = load_split()
    ids = token_chunks(encode(tok, train[: 40 * args.length * args.chunks]), args.length, args.chunks)
    index = {id(m): i for i, m in model._lola.modules.items()}
    shares: dict[int, list[torch.Tensor]] = {}

    def record(call) -> None:
        shares.setdefault(index[id(call.layer)], []).append(call.share()[0].flatten().float())

    with torch.no_grad(), observe_calls(record):
        for row in ids:
            model(row[None], cache=LoLACache(model))
    every = torch.cat([torch.cat(v) for v in shares.values()])
    limit = 2**24  # torch.quantile's largest input: beyond it, a seeded random subset
    sample = every if every.numel() <= limit else every[torch.randperm(every.numel(), generator=torch.Generator().manual_seed(0))[:limit]]
    out = {
        "length": args.length,
        "chunks": int(ids.shape[0]),
        "quantiles": {str(q): round(float(torch.quantile(sample, q)), 4) for q in (0.5, 0.9, 0.99, 0.999)},
        "per_layer_q99": {i: round(float(torch.quantile(torch.cat(v)[:limit], 0.99)), 4) for i, v in sorted(shares.items())},
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
