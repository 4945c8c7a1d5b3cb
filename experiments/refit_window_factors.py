"""Refit a linearized model's window factors for the rule LoLA reads it with, sparse cache in place.

The shipped linearized SmolLM2 was trained as a sliding-window hybrid with the ``lolcats`` rule;
LoLA reads it with the paper's ``lola_authors`` rule and a sparse cache it never saw in
training. This experiment keeps every weight (maps, LoRA) and refits only the per-head window
factors ``w = sigmoid(·)`` (270 numbers for SmolLM2) so that each LoLA layer, *as it runs at
inference* (sinks, window, calibrated sparse budgets, SRE, chunkwise steps, the rule), imitates
the layer's softmax attention on training text: LoLCATs' attention-transfer loss (1000 · MSE of
the attention output before ``o_proj``), with the teacher's ``q, k, v`` taken from the LoRA-merged
weights. Gradients flow through the reference engine (the Triton ops are forward-only); the
selection itself is not differentiated.

    python experiments/refit_window_factors.py --out runs/refit-authors
    lola niah --feature-maps runs/refit-authors --methods lola --lengths 2048 4096 --samples 20 --batch-size 4

Training chunks come from the default corpus's training split (never the pass-key prompts);
the before/after MSE is measured on held-out documents. The output is a feature-map folder
(the shipped maps and LoRA with the new window factors) that every lola command accepts.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--feature-maps", default="smollm2-135m-instruct", help="a feature-map folder or a shipped name")
    parser.add_argument("--out", required=True, help="the new feature-map folder (must not exist)")
    parser.add_argument("--mixing", default="lola_authors", choices=["lola_authors", "lolcats"])
    parser.add_argument("--budgets", default="auto", help="auto (the model's shipped budgets), uniform, a name or a file")
    parser.add_argument("--window", type=int, default=60)
    parser.add_argument("--sparse-size", type=int, default=192)
    parser.add_argument("--sinks", type=int, default=4)
    parser.add_argument("--chunk-tokens", type=int, default=2048)
    parser.add_argument("--train-chunks", type=int, default=6)
    parser.add_argument("--eval-chunks", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=5e-2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = Path(args.out)
    if out.exists():
        raise SystemExit(f"{out} exists; choose another --out")

    from lola import budgets as head_budgets
    from lola import models
    from lola.config import LoLAConfig
    from lola.data.text import encode, load_split, token_chunks
    from lola.integrations.transformers import apply_lola
    from lola.linearize.teacher import collect_activations
    from lola.pretrained.folder import read_feature_maps, write_feature_maps
    from lola.pretrained.lora import merge_lora, restore_weights

    torch.manual_seed(args.seed)
    model, tok = models.load(args.model)
    maps = read_feature_maps(args.feature_maps)
    train_text, heldout_text = load_split(None)
    every = token_chunks(encode(tok, train_text), args.chunk_tokens)
    pick = torch.randperm(every.shape[0], generator=torch.Generator().manual_seed(args.seed))[: args.train_chunks]
    train, heldout = every[pick], token_chunks(encode(tok, heldout_text), args.chunk_tokens, args.eval_chunks)

    # The teacher: the LoRA-merged weights with softmax attention (what LoLA's layers see as q, k, v).
    originals = merge_lora(model, maps.lora, maps.lora_spec) if maps.lora is not None else {}
    t0 = time.time()
    acts_train, acts_eval = collect_activations(model, train), collect_activations(model, heldout)
    restore_weights(model, originals)
    print(f"teacher activations: {train.shape[0]} + {heldout.shape[0]} chunks of {args.chunk_tokens} in {time.time() - t0:.0f}s", flush=True)

    cfg = LoLAConfig(window=args.window, sparse_size=args.sparse_size, sinks=args.sinks, mixing=args.mixing)
    budgets = args.model if args.budgets == "auto" and args.model in head_budgets.available() else args.budgets
    if budgets not in ("auto", "uniform"):
        cfg = head_budgets.load(budgets).apply(cfg)
    apply_lola(model, cfg, feature_maps=maps)  # the layers exactly as LoLA runs them
    students = model._lola.modules
    for p in model.parameters():
        p.requires_grad_(False)
    factors = [s.window_factors for s in students.values()]
    for f in factors:
        f.requires_grad_(True)
    before = {i: f.detach().clone() for i, f in zip(students, factors)}

    def layer_loss(i: int, acts) -> torch.Tensor:
        a = acts[i]
        q, k, v = (x.float().transpose(1, 2) for x in (a.q, a.k, a.v))  # [1, T, H, D]
        y, _ = students[i](q, k, v)
        return 1000.0 * torch.mean((y.float() - a.y.float().transpose(1, 2)) ** 2)

    def heldout_mse() -> float:
        with torch.no_grad():
            return sum(layer_loss(i, acts).item() for acts in acts_eval for i in students) / len(acts_eval) / len(students) / 1000.0

    mse_before = heldout_mse()
    print(f"held-out attention MSE (mean over layers) before: {mse_before:.5f}", flush=True)
    opt = torch.optim.Adam(factors, lr=args.lr)
    losses = []
    for epoch in range(args.epochs):
        for c, acts in enumerate(acts_train):
            t = time.time()
            opt.zero_grad()
            loss = sum(layer_loss(i, acts) for i in students) / len(students)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            print(f"epoch {epoch} chunk {c}: loss {loss.item():.3f} ({time.time() - t:.0f}s)", flush=True)
    mse_after = heldout_mse()
    print(f"held-out attention MSE (mean over layers) after: {mse_after:.5f}", flush=True)

    tensors = dict(maps.tensors)
    for i, f in zip(students, factors):
        tensors[f"model.layers.{i}.self_attn.window_factors"] = f.detach().clone()
    write_feature_maps(out, tensors, maps.config, maps.geometry, model_name=args.model, lora=maps.lora, lora_spec=maps.lora_spec)
    w_before = torch.sigmoid(torch.cat([b.flatten() for b in before.values()]))
    w_after = torch.sigmoid(torch.cat([f.detach().flatten() for f in factors]))
    report = {
        "what": "window factors refit for the inference rule with the sparse cache in place (experiments/refit_window_factors.py)",
        "args": vars(args),
        "mse_heldout_mean": {"before": mse_before, "after": mse_after},
        "train_loss": losses,
        "w": {"before_mean": float(w_before.mean()), "after_mean": float(w_after.mean()), "after_min": float(w_after.min()), "after_max": float(w_after.max())},
        "w_after_per_layer": {i: torch.sigmoid(f.detach().flatten()).tolist() for i, f in zip(students, factors)},
    }
    (out / "refit_report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"w: mean {report['w']['before_mean']:.3f} -> {report['w']['after_mean']:.3f} (min {report['w']['after_min']:.3f}, max {report['w']['after_max']:.3f})"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
