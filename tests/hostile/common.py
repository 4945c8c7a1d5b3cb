"""Helpers of the hostile-input tests: command refusals, folder snapshots, random feature maps."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

import lola
from lola.cli import main


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every plain file under ``folder`` with its bytes (to prove nothing was written over)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()}


def refused(capsys, argv: list[str], *fragments: str) -> str:
    """Run ``lola ARGV``: exit status 2 and exactly one stderr line holding every fragment."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"lola {argv[0]}: error: ") and err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    return err


def write_random_maps(folder: Path, seed: int = 0, **kwargs) -> None:
    """A valid feature-map folder for the tiny random Llama (random Hedgehog maps, ``f = 8``)."""
    from lola.models import tiny_random
    from lola.pretrained.folder import model_geometry, write_feature_maps

    model, _ = tiny_random()
    geometry = model_geometry(model)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for i in range(geometry["num_layers"]):
        prefix = f"model.layers.{i}.self_attn."
        for side in ("q", "k"):
            tensors[prefix + f"feature_map_{side}.mlp.layer"] = torch.randn(geometry["num_heads"], geometry["head_dim"], 8, generator=g)
        tensors[prefix + "window_factors"] = torch.zeros(1, geometry["num_heads"], 1, 1)
    cfg = lola.LoLAConfig(window=8, sparse_size=0, sinks=0, schedule="tokenwise", feature_map="hedgehog", feature_dim=8, mixing="lolcats")
    write_feature_maps(folder, tensors, cfg, geometry, **kwargs)


def edit_cache(folder: Path, tensors: Callable[[dict], None] | None = None, meta: Callable[[dict], None] | None = None) -> None:
    """Edit a saved cache and record the new sums, as a deliberate edit would (not damage)."""
    import hashlib

    from safetensors.torch import load_file, save

    from lola.integrations.transformers.cache import _meta_checksum

    description = json.loads((folder / "cache.json").read_text())
    if tensors is not None:
        loaded = load_file(folder / description["tensors"])
        tensors(loaded)
        data = save(loaded)
        (folder / description["tensors"]).write_bytes(data)
        description["sha256"] = hashlib.sha256(data).hexdigest()
    if meta is not None:
        meta(description)
    description["checksum"] = _meta_checksum(description)
    (folder / "cache.json").write_text(json.dumps(description))
