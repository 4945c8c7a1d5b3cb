"""When does each scoring policy lose the needle? Heads holding it, segment by segment of the prefill.

`lola probe` says whether the needle is among a head's exact tokens when the answer starts; this
script says *when* it left. Each prompt of a `lola niah` run (the same prompts, `--seed`,
`--lengths`) is fed to the model in segments of `--segment` tokens (a multiple of the chunk:
the same select-and-evict steps as one prefill), and after each segment it counts, over every
layer and K/V head, the heads whose exact tokens hold every token of the needle's value, and
where in the context the sparse cache's tokens come from (by eighths of the prompt). One JSON
line per (policy, prompt) goes to `--out` (a rerun skips those done); a table is printed.

    python experiments/needle_timeline.py --feature-maps smollm2-135m-instruct --policies sre learned --lengths 8192 --samples 4 --seed 1 --out timeline.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def held_heads(state, want: torch.Tensor) -> list[bool]:
    """Per K/V head of row 0: every position of ``want`` is among the head's exact tokens."""
    pos = torch.cat([m.block.pos for m in state.exact_memories if m.capacity], dim=-1)[0]  # [Hs, N]
    return (pos[:, :, None] == want).any(1).all(-1).tolist()


def sparse_by_eighths(state, length: int) -> list[int]:
    """Sparse-cache tokens of row 0 (every head) counted by the eighth of the prompt they are from."""
    sparse = [m for m in state.exact_memories if m.name == "sparse"]
    if not sparse:
        return [0] * 8
    pos = sparse[0].block.pos[0]
    pos = pos[pos >= 0]
    return torch.bincount((pos * 8 // max(length, 1)).clamp(max=7), minlength=8).tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--feature-maps", required=True, help="a shipped name or a `lola linearize` folder")
    parser.add_argument("--policies", nargs="+", default=["sre", "learned"])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192])
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--segment", type=int, default=512)
    parser.add_argument("--window", type=int, help="as lola niah's (default: its default)")
    parser.add_argument("--sparse-size", type=int, help="as lola niah's (default: its default)")
    parser.add_argument("--out", required=True, help="a JSON-lines file (appended; finished prompts are skipped)")
    args = parser.parse_args()

    from lola import models
    from lola.eval.niah_execution import niah_prompts
    from lola.eval.niah_spec import NiahRun, method_configs
    from lola.eval.state_probe import needle_positions
    from lola.integrations.transformers import LoLACache, apply_lola, remove_lola
    from lola.layer import observe_calls
    from lola.pretrained.folder import read_feature_maps

    extra = {k: v for k, v in (("window", args.window), ("sparse_size", args.sparse_size)) if v is not None}
    run = NiahRun(
        model=args.model,
        feature_maps=args.feature_maps,
        methods=["lola"],
        policies=args.policies,
        lengths=args.lengths,
        samples=args.samples,
        seed=args.seed,
        **extra,
    )
    if args.segment % run.chunk:
        raise SystemExit(f"--segment must be a multiple of the chunk ({run.chunk}), got {args.segment}")
    out = Path(args.out)
    done = {(r["method"], r["length"], r["index"]) for r in map(json.loads, out.read_text().splitlines())} if out.is_file() else set()
    model, tok = models.load(run.model)
    maps = read_feature_maps(run.feature_maps)
    prompts = niah_prompts(run, tok)
    for method, cfg in method_configs(run).items():
        apply_lola(model, cfg, feature_maps=maps)
        layer_of = {id(m): i for i, m in model._lola.modules.items()}
        try:
            for (length, index), sample in sorted(prompts.items()):
                if (method, length, index) in done:
                    continue
                ids = sample.input_ids
                want = torch.tensor(needle_positions(tok, ids[0], sample.answers[0]))
                seen: dict[int, tuple] = {}

                def record(call, want=want, length=ids.shape[1], seen=seen) -> None:
                    i = layer_of.get(id(call.layer))
                    if i is not None:
                        seen[i] = (held_heads(call.state, want), sparse_by_eighths(call.state, length))

                cache, held, eighths = LoLACache(model), [], [0] * 8
                with torch.no_grad(), observe_calls(record):
                    for a in range(0, ids.shape[1], args.segment):
                        end = min(a + args.segment, ids.shape[1])
                        model(ids[:, a:end], attention_mask=torch.ones_like(ids[:, :end]), cache=cache)
                        held.append(sum(sum(h) for h, _ in seen.values()))
                for _, counts in seen.values():
                    eighths = [x + y for x, y in zip(eighths, counts)]
                record_line = {
                    "method": method,
                    "length": length,
                    "index": index,
                    "depth": sample.depth,
                    "needle_at": int(want.min()) if want.numel() else None,
                    "heads": sum(len(h) for h, _ in seen.values()),
                    "held_after_segment": held,
                    "sparse_by_eighths": eighths,
                }
                with open(out, "a") as f:
                    f.write(json.dumps(record_line) + "\n")
                total = max(sum(eighths), 1)
                print(
                    f"{method} {length} #{index} depth {sample.depth:.3f} needle at {record_line['needle_at']}: heads holding it after each "
                    f"{args.segment} tokens {held}; sparse tokens by eighth of the prompt (%) {[round(100 * x / total) for x in eighths]}",
                    flush=True,
                )
        finally:
            remove_lola(model)


if __name__ == "__main__":
    main()
