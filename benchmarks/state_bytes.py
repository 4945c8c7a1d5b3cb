"""Bytes a LoLA state holds and saves: uniform against calibrated per-head budgets, SmolLM2's shape.

    python benchmarks/state_bytes.py [--sparse-size 64 192] [--budgets smollm2-135m-instruct]

For each sparse size the model's resolved config is built with uniform budgets and with the
named calibrated ones (the same slots in total), every layer run on 8 bfloat16 tokens (batch
1); prints ``LoLAMemory.nbytes()`` summed over the layers (what the running state holds: per-head
sparse slots in one ragged run) and the bytes of ``state_dict()`` (what is saved: the same run),
and their ratio. No model weights are loaded: the state's size
depends on the shape and the config only.
"""

from __future__ import annotations

import argparse

import torch

import lola
from lola.pretrained.resolve import resolve_config

SHAPE = {"num_heads": 9, "num_kv_heads": 3, "head_dim": 64, "layers": 30}  # SmolLM2-135M


def state_bytes(config: lola.LoLAConfig) -> tuple[int, int]:
    """``(held, saved)`` bytes over every layer of the shape, batch 1."""
    h, hkv, d = SHAPE["num_heads"], SHAPE["num_kv_heads"], SHAPE["head_dim"]
    held = saved = 0
    for layer in range(SHAPE["layers"]):
        attn = lola.compose(config.for_layer(layer), num_heads=h, head_dim=d, num_kv_heads=hkv, layer=layer)
        q, kv = torch.randn(1, 8, h, d, dtype=torch.bfloat16), torch.randn(1, 8, hkv, d, dtype=torch.bfloat16)
        with torch.no_grad():
            _, state = attn(q, kv, kv)
        held += state.nbytes()
        saved += sum(t.numel() * t.element_size() for t in state.state_dict().values())
    return held, saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sparse-size", type=int, nargs="+", default=[64, 192], help="uniform sparse size (the calibrated budgets keep its total)")
    parser.add_argument("--budgets", default="smollm2-135m-instruct", help="shipped or saved per-head budgets")
    args = parser.parse_args()
    print(f"{'sparse':>6} {'budgets':<24} {'held MiB':>9} {'saved MiB':>9} {'held/saved':>10}")
    for size in args.sparse_size:
        for budgets in ("uniform", args.budgets):
            cfg = resolve_config({"sparse_size": size}, model="smollm2-135m-instruct", budgets=budgets)
            held, saved = state_bytes(cfg)
            print(f"{size:>6} {budgets:<24} {held / 2**20:>9.2f} {saved / 2**20:>9.2f} {held / saved:>10.2f}")


if __name__ == "__main__":
    main()
