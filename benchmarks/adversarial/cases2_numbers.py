"""Batch 2, class 5: numbers.

Finite values at the edge of float64 (1e308, subnormals, negative zero), integers beyond
64 bits, numpy scalars, ``1_000``, bools inside lists, NaN nested in ``layer_overrides`` of a
variant, per-head lists of the wrong length, seeds that torch cannot take, the training
configs' own schemas reached through the API, a generation that would run past the model's
positions, and NaN written into a saved LoLA model's weights.
"""

from __future__ import annotations

import numpy as np
import torch
from common import LINEARIZE, NIAH, PPL, hay, ids, lm_eval_model, niah, tiny
from common2 import status
from harness import Case, CaseFailure, Ctx, accept, cli, either, ensure, refuse

import lola


def _layer(cfg_kwargs: dict):
    """A standalone layer with ``cfg_kwargs``, 40 tokens (steps and scoring run)."""

    def run(ctx: Ctx):
        cfg = lola.LoLAConfig(**{"window": 8, "sparse_size": 4, "sinks": 2, "chunk": 4, **cfg_kwargs})
        attn = lola.compose(cfg, num_heads=4, head_dim=8, num_kv_heads=2)
        x = torch.randn(1, 40, 4, 8, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            o, _ = attn(x, x[:, :, :2], x[:, :, :2])
        return o

    return run


def _finite(out, ctx) -> None:
    ensure(bool(torch.isfinite(out).all()), f"accepted; {int((~torch.isfinite(out)).sum())} of {out.numel()} outputs are inf or NaN")


def _read_as(field: str, value):
    def check(cfg, ctx):
        got = getattr(cfg, field)
        ensure(got == value and type(got) is type(value), f"accepted, and read as {field}={got!r} ({type(got).__name__})")

    return check


def _accepted_as(what: str):
    def check(result, ctx):
        raise CaseFailure(f"accepted, and read as {what}")

    return check


def _apply_per_head(ctx: Ctx):
    from lola.integrations.transformers import apply_lola

    model, _ = tiny()
    return apply_lola(model, lola.LoLAConfig(window=8, sparse_size_per_head=[4, 4, 4]))


def _lm(args: str):
    return lambda ctx: lm_eval_model(args)


def _nan_in_saved_lola_weights(ctx: Ctx):
    """A LoLA model (trainable hedgehog maps, lolcats mixing) saved with save_pretrained; one of
    its feature-map tensors set to NaN in the safetensors file; loaded with lola.from_pretrained
    and run."""
    from safetensors.torch import load_file, save_file

    from lola.integrations.transformers import apply_lola, from_pretrained

    model, _ = tiny()
    apply_lola(model, lola.LoLAConfig(window=8, sparse_size=4, sinks=2, chunk=4, feature_map="hedgehog", feature_dim=8, mixing="lolcats"))
    model.save_pretrained(ctx.path("saved"))
    path = ctx.path("saved") / "model.safetensors"
    tensors = load_file(path)
    key = next(k for k in sorted(tensors) if ".lola." in k and "feature_map" in k)
    tensors[key] = torch.full_like(tensors[key], float("nan"))
    save_file(tensors, path, metadata={"format": "pt"})
    loaded = from_pretrained(ctx.path("saved"))
    with torch.no_grad():
        return loaded(ids(24, 256), use_cache=False).logits


def _linearize_config(**kwargs):
    def run(ctx: Ctx):
        from lola.linearize import LinearizeConfig

        return LinearizeConfig(**kwargs)

    return run


def _finetune_config(**kwargs):
    def run(ctx: Ctx):
        from lola.linearize import FinetuneConfig

        return FinetuneConfig(**kwargs)

    return run


def _maps_finite(result, ctx) -> None:
    from lola.pretrained.folder import read_feature_maps

    ensure(result.status == 0, f"exit {result.status}")
    read_feature_maps(ctx.path("lin"))  # refuses non-finite tensors


def _budgets_negative_zero(ctx: Ctx):
    from lola import budgets

    path = ctx.write("b.json", '{"sparse_size_per_head": [[8, 8], [8, 8]], "uniform_sparse_size": 8, "scores": [[-0.0, 1.0], [1.0, 5e-324]], "power": 0.5}')
    return budgets.load(path)


CALIBRATE = ["calibrate", "--model", "tiny-random-llama", "--length", "256", "--prompts", "1"]
LOLA = [*NIAH[:-1], "lola", "--window", "8", "--sparse-size", "8"]

CASES = [
    Case(
        "n2-config-window-factor-init-1e308",
        "numbers",
        "LoLAConfig(window_factor_init=1e308) (finite), a layer built and run",
        _layer({"window_factor_init": 1e308, "mixing": "lolcats"}),
        either("window_factor_init", check=_finite),
    ),
    Case(
        "n2-expected-attention-rope-theta-1e308",
        "numbers",
        "expected_attention with rope_theta=1e308 (finite, > 0), a layer run over 40 tokens",
        _layer({"policy": "expected_attention", "policy_kwargs": {"rope_theta": 1e308}}),
        either("rope_theta", check=_finite),
    ),
    Case(
        "n2-config-numpy-int64-window",
        "numbers",
        "LoLAConfig(window=np.int64(8)) (a numpy scalar)",
        lambda ctx: lola.LoLAConfig(window=np.int64(8)),
        either("window", check=_read_as("window", 8)),
    ),
    Case(
        "n2-config-numpy-float32-scale",
        "numbers",
        "LoLAConfig(scale=np.float32(0.25)) (a numpy scalar that is no Python float)",
        lambda ctx: lola.LoLAConfig(scale=np.float32(0.25)),
        either("scale", check=_read_as("scale", 0.25)),
    ),
    Case(
        "n2-config-scale-negative-zero",
        "numbers",
        "LoLAConfig(scale=-0.0)",
        lambda ctx: lola.LoLAConfig(scale=-0.0),
        refuse("scale"),
    ),
    Case(
        "n2-config-scale-subnormal",
        "numbers",
        "LoLAConfig(scale=5e-324) (> 0, subnormal), a layer run over 40 tokens",
        _layer({"scale": 5e-324}),
        either("scale", check=_finite),
    ),
    Case(
        "n2-config-window-2pow63",
        "numbers",
        "LoLAConfig(window=2**63)",
        lambda ctx: lola.LoLAConfig(window=2**63),
        refuse("window"),
    ),
    Case(
        "n2-config-bool-in-per-head-list",
        "numbers",
        "LoLAConfig(window_per_head=[8, True])",
        lambda ctx: lola.LoLAConfig(window_per_head=[8, True]),
        refuse("window_per_head", check=_accepted_as("window_per_head [8, 1]")),
    ),
    Case(
        "n2-apply-per-head-list-wrong-length",
        "numbers",
        "apply_lola(tiny model with 2 K/V heads, sparse_size_per_head=[4, 4, 4])",
        _apply_per_head,
        refuse("sparse_size_per_head"),
    ),
    Case(
        "n2-niah-variant-layer-override-nan",
        "numbers",
        "lola niah --config: a variant whose layer_overrides set layer 0's scale to .nan",
        lambda ctx: cli(
            [*LOLA, "--config", str(ctx.write("opts.yaml", 'variants:\n  a:\n    layer_overrides:\n      "0": {scale: .nan}\n')), "--out", str(ctx.path("r"))]
        ),
        refuse("scale"),
    ),
    Case(
        "n2-lm-eval-per-head-list-with-bool",
        "numbers",
        "lm-eval model_args sparse_size_per_head=[8,true] (JSON)",
        _lm("pretrained=tiny-random-llama,sparse_size_per_head=[8,true]"),
        refuse("sparse_size_per_head"),
    ),
    Case(
        "n2-lm-eval-sparse-size-underscored",
        "numbers",
        "lm-eval model_args sparse_size=1_000 (read as 1000, or refused)",
        _lm("pretrained=tiny-random-llama,sparse_size=1_000"),
        either("sparse_size", check=lambda lm, ctx: ensure(lm.lola_config.sparse_size == 1000, f"read as {lm.lola_config.sparse_size!r}")),
    ),
    Case(
        "n2-lm-eval-window-negative-zero",
        "numbers",
        "lm-eval model_args window=-0.0 (a float, not the int it would be written as)",
        _lm("pretrained=tiny-random-llama,window=-0.0"),
        either("window", check=lambda lm, ctx: ensure(lm.lola_config.window == 0, f"read as {lm.lola_config.window!r}")),
    ),
    Case(
        "n2-span-radius-2pow70",
        "numbers",
        "span policy with radius 2**70, a layer run over 40 tokens",
        _layer({"policy": "span", "policy_kwargs": {"radius": 2**70}}),
        refuse("radius"),
    ),
    Case(
        "n2-demo-seed-2pow64",
        "numbers",
        "lola demo --seed 18446744073709551616 (2**64, beyond torch's seeds)",
        lambda ctx: cli(["demo", "--length", "64", "--trials", "1", "--budget", "16", "--seed", str(2**64)]),
        refuse("--seed"),
    ),
    Case(
        "n2-linearize-seed-2pow64",
        "numbers",
        "lola linearize --quick --stage 1 --seed 2**64",
        lambda ctx: cli([*LINEARIZE, "--seed", str(2**64), "--out", str(ctx.path("lin"))]),
        refuse("--seed"),
    ),
    Case(
        "n2-niah-seed-2pow64",
        "numbers",
        "lola niah --seed 2**64 (prompt seeds are Python ints: any integer is a seed)",
        lambda ctx: niah(ctx, "r", "--seed", str(2**64)),
        either("--seed", check=status(0)),
    ),
    Case(
        "n2-linearize-config-window-bool",
        "numbers",
        "lola.linearize.LinearizeConfig(window=True) through the API",
        _linearize_config(window=True),
        refuse("window", check=_accepted_as("window=1")),
    ),
    Case(
        "n2-linearize-config-steps-float",
        "numbers",
        "lola.linearize.LinearizeConfig(steps=2.0) through the API",
        _linearize_config(steps=2.0),
        refuse("steps", check=_accepted_as("steps=2")),
    ),
    Case(
        "n2-finetune-config-lora-rank-bool",
        "numbers",
        "lola.linearize.FinetuneConfig(lora_rank=True) through the API",
        _finetune_config(lora_rank=True),
        refuse("lora_rank", check=_accepted_as("lora_rank=1")),
    ),
    Case(
        "n2-linearize-lr-1e30",
        "numbers",
        "lola linearize --quick --stage 1 --lr 1e30 (finite): written maps must be readable and finite",
        lambda ctx: cli([*LINEARIZE, "--lr", "1e30", "--out", str(ctx.path("lin"))]),
        either("--lr", check=_maps_finite),
    ),
    Case(
        "n2-perplexity-generate-past-positions",
        "numbers",
        "lola perplexity --lengths 64 --generate 8200 (64 + 8200 > the model's 8192 positions)",
        lambda ctx: cli([*PPL[:-2], "--methods", "full", "--generate", "8200", "--generate-windows", "1", "--text", str(hay(ctx))]),
        refuse("--generate"),
        timeout=90,
    ),
    Case(
        "n2-budgets-negative-zero-and-subnormal-scores",
        "numbers",
        "a budgets file with scores -0.0 and 5e-324 (both >= 0)",
        _budgets_negative_zero,
        accept(lambda b, ctx: ensure(b.total_slots == 32, f"read {b.total_slots} slots")),
    ),
    Case(
        "n2-from-pretrained-nan-lola-weights",
        "numbers",
        "a LoLA model saved with save_pretrained, a feature-map tensor set to NaN in model.safetensors, lola.from_pretrained, a forward",
        _nan_in_saved_lola_weights,
        refuse("model.safetensors|saved", check=_finite),
    ),
]
