"""Adversarial cases of class ``numbers``: numbers out of range, not finite, or of the wrong kind.

Batch 1. inf, NaN, huge, negative, zero, bool-for-int and float-for-int values in config fields,
policy options, command-line options, budgets files, feature-map descriptions, saved caches and
lm-eval model_args; and sizes that would allocate far more memory than the work needs (the child
runs under an address-space limit, so such a case comes out ``oom`` unless lola refuses it first).

Batch 2. Finite values at the edge of float64 (1e308, subnormals, negative zero), integers beyond
64 bits, numpy scalars, ``1_000``, bools inside lists, NaN nested in ``layer_overrides`` of a
variant, per-head lists of the wrong length, seeds that torch cannot take, the training configs'
own schemas reached through the API, a generation that would run past the model's positions, and
NaN written into a saved LoLA model's weights.

Batch 3. The limits of bounded positions (``exact_distance``, ``state_positions``: zero, negative,
beyond the model's context, a bool, a float, a string) through the config, ``lola niah``, ``lola
perplexity``, ``lola probe``, ``lola export --config``, lm-eval and ``lola.compose``; booleans where
numbers belong and numbers (or truthy strings) where booleans belong, in YAML and JSON config
files, variants, ``LoLAConfig``, ``apply_lola(force=)``, ``export_pretrained(vllm=)`` and
``calibrate()``; a float where the sweep spec takes a fraction string.
"""

from __future__ import annotations

import json

import numpy as np
import torch

import lola

from ...common import edit_cache, write_random_maps
from ..builders import (
    LINEARIZE,
    LOLA,
    NIAH,
    NIAH_LOLA,
    PPL,
    attend,
    budgets_file,
    continue_with,
    described,
    edit_json,
    hay,
    ids,
    layer,
    lm_eval_model,
    niah,
    niah_config,
    niah_option,
    perplexity,
    ppl,
    probe,
    saved_cache,
    status,
    tiny,
)
from ..harness import Case, CaseFailure, Ctx, accept, cli, either, ensure, in_batch, refuse


def _layer_run(cfg_kwargs: dict):
    """A standalone layer with ``cfg_kwargs`` over 40 tokens (so that steps and scoring run)."""
    return lambda ctx: attend(layer(lola.LoLAConfig(**{"window": 8, "sparse_size": 4, "sinks": 2, "chunk": 4, **cfg_kwargs})))[0]


def _finite(out, ctx) -> None:
    ensure(bool(torch.isfinite(out).all()), f"accepted; {int((~torch.isfinite(out)).sum())} of {out.numel()} outputs are inf or NaN")


def _finite_run(id: str, what: str, cfg_kwargs: dict, field: str) -> Case:
    """A number at an edge of its range: refused naming ``field``, or a layer built with it runs
    over 40 tokens to finite outputs."""
    return Case(id, "numbers", what, _layer_run(cfg_kwargs), either(field, check=_finite))


def _config(**kwargs):
    return lambda ctx: lola.LoLAConfig(**kwargs)


def _accepted_as(what: str):
    def check(result, ctx):
        raise CaseFailure(f"accepted, and read as {what}")

    return check


def _misread(id: str, what: str, run, field: str, read: str) -> Case:
    """A number of the wrong kind: it must be refused naming ``field``, not read as ``read``."""
    return Case(id, "numbers", what, run, refuse(field, check=_accepted_as(read)))


def _budgets(**fields):
    def run(ctx: Ctx):
        from lola import budgets

        return budgets.load(budgets_file(ctx.path("b.json"), **fields))

    return run


def _maps_edit(change):
    """A feature-map folder whose lola_config.json is changed by ``change(meta)``, applied to the tiny model."""

    def run(ctx: Ctx):
        from lola.integrations.transformers import apply_lola

        write_random_maps(ctx.path("m"))
        edit_json(ctx.path("m") / "lola_config.json", change)
        model, _ = tiny()
        apply_lola(model, lola.LoLAConfig(sparse_size=0), feature_maps=ctx.path("m"))
        return model

    return run


def _lora_folder(rank, alpha: float):
    """A stage-2 folder (LoRA on q_proj) whose description says ``rank`` and ``alpha``; returns logits."""

    def run(ctx: Ctx):
        from lola.integrations.transformers import apply_lola
        from lola.pretrained.lora import LoraSpec

        model, _ = tiny()
        lora = {}
        for i, decoder_layer in enumerate(model.model.layers):
            w = decoder_layer.self_attn.q_proj.weight
            lora[f"base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight"] = torch.full((2, w.shape[1]), 0.01)
            lora[f"base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight"] = torch.full((w.shape[0], 2), 0.01)
        write_random_maps(ctx.path("m"), lora=lora, lora_spec=LoraSpec(rank=2, alpha=4.0))
        edit_json(ctx.path("m") / "lola_config.json", lambda m: m["lora"].update(rank=rank, alpha=alpha))
        apply_lola(model, lola.LoLAConfig(sparse_size=0), feature_maps=ctx.path("m"))
        with torch.no_grad():
            return model(ids(16, 256), use_cache=False).logits

    return run


def _huge_lengths(ctx: Ctx):
    from lola.integrations.transformers import LoLACache

    model, _ = saved_cache(ctx.path("c"))
    edit_cache(ctx.path("c"), meta=lambda m: m.update(cumulative_lengths=[10**15, 10**15]))
    return continue_with(model, LoLACache.load(ctx.path("c"), model))


def _decoded_anyway(out, ctx) -> None:
    _finite(out, ctx)
    raise CaseFailure("decoded at positions near 10**15 (RoPE far beyond the model's 8192) without a word")


def _lm_eval(args: str):
    def run(ctx: Ctx):
        return lm_eval_model(args)

    return run


def _status_0(result, ctx):
    ensure(result.status == 0, f"exit {result.status}")


CALIBRATE = ["calibrate", "--model", "tiny-random-llama", "--length", "256", "--prompts", "1"]


def _read_as(field: str, value):
    def check(cfg, ctx):
        got = getattr(cfg, field)
        ensure(got == value and type(got) is type(value), f"accepted, and read as {field}={got!r} ({type(got).__name__})")

    return check


def _numpy_scalar(id: str, what: str, field: str, scalar, value) -> Case:
    """``LoLAConfig(field=scalar)`` for a numpy scalar: refused naming ``field``, or read as the
    Python ``value`` of the field's type."""
    return Case(id, "numbers", what, lambda ctx: lola.LoLAConfig(**{field: scalar}), either(field, check=_read_as(field, value)))


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


# -- batch 1: written before the fixes it led to ----------------------------------------------------

BATCH_1 = [
    _finite_run("num-config-scale-huge", "LoLAConfig(scale=1e300) (finite, > 0), a layer run over 40 tokens", {"scale": 1e300}, "scale"),
    _misread(
        "num-policy-random-seed-bool",
        "LoLAConfig(policy='random', policy_kwargs={'seed': True})",
        _config(policy="random", policy_kwargs={"seed": True}),
        "seed",
        "seed=1",
    ),
    _misread(
        "num-policy-span-radius-bool",
        "LoLAConfig(policy='span', policy_kwargs={'radius': True})",
        _config(policy="span", policy_kwargs={"radius": True}),
        "radius",
        "radius=1",
    ),
    _misread(
        "num-policy-fusion-weight-bool",
        "fusion policy with weights [True, 1.0]",
        _config(policy="fusion", policy_kwargs={"policies": ["sre", "key_norm"], "weights": [True, 1.0]}),
        "weights",
        "weights[0]=1.0",
    ),
    _finite_run(
        "num-policy-fusion-weights-huge",
        "fusion policy with weights [1e308, 1e308] (finite), a layer run over 40 tokens",
        {"policy": "fusion", "policy_kwargs": {"policies": ["sre", "key_norm"], "weights": [1e308, 1e308]}},
        "weights",
    ),
    _finite_run(
        "num-policy-rope-theta-tiny",
        "expected_attention with rope_theta=1e-300 (> 0), a layer run over 40 tokens",
        {"policy": "expected_attention", "policy_kwargs": {"rope_theta": 1e-300}},
        "rope_theta",
    ),
    _finite_run(
        "num-policy-half-life-tiny",
        "expected_attention with query_half_life=1e-300 (> 0), a layer run over 40 tokens",
        {"policy": "expected_attention", "policy_kwargs": {"query_half_life": 1e-300}},
        "query_half_life",
    ),
    niah_option("num-niah-sinks-negative", "numbers", "--sinks", "-1", refuse("--sinks")),
    niah_option("num-niah-chunk-zero", "numbers", "--chunk", "0", refuse("--chunk")),
    niah_option(
        id="num-niah-max-new-tokens-beyond-length",
        cls="numbers",
        what="lola niah --lengths 400 --max-new-tokens 100000",
        option="--max-new-tokens",
        value="100000",
        expect=refuse("--max-new-tokens|max_new_tokens"),
    ),
    Case("num-niah-seed-negative", "numbers", "lola niah --seed -1 (any integer seeds)", lambda ctx: niah(ctx, "r", "--seed", "-1"), accept(_status_0)),
    Case(
        "num-niah-window-16m",
        "numbers",
        "lola niah --methods window --window 16000000 --sparse-size 0 on 400-token prompts",
        lambda ctx: niah(ctx, "r", "--window", "16000000", "--sparse-size", "0"),
        refuse("--window"),
    ),
    Case(
        "num-niah-sparse-16m",
        "numbers",
        "lola niah --methods lola --sparse-size 16000000 on 400-token prompts",
        lambda ctx: cli([*NIAH_LOLA, "--window", "8", "--sparse-size", "16000000", "--out", str(ctx.path("r"))]),
        refuse("--sparse-size"),
    ),
    Case(
        "num-demo-length-max-tokens",
        "numbers",
        "lola demo --length 16777216 --trials 1 --budget 64",
        lambda ctx: cli(["demo", "--length", "16777216", "--trials", "1", "--budget", "64"]),
        refuse("--length"),
    ),
    Case(
        "num-demo-seed-negative",
        "numbers",
        "lola demo --length 64 --trials 1 --budget 16 --seed -1",
        lambda ctx: cli(["demo", "--length", "64", "--trials", "1", "--budget", "16", "--seed", "-1"]),
        accept(_status_0),
    ),
    Case(
        "num-calibrate-sparse-size-negative",
        "numbers",
        "lola calibrate --sparse-size -1",
        lambda ctx: cli([*CALIBRATE, "--sparse-size", "-1", "--out", str(ctx.path("b.json"))]),
        refuse("--sparse-size"),
    ),
    Case(
        "num-calibrate-floor-above-sparse-size",
        "numbers",
        "lola calibrate --sparse-size 8 --floor 9",
        lambda ctx: cli([*CALIBRATE, "--sparse-size", "8", "--floor", "9", "--out", str(ctx.path("b.json"))]),
        refuse("--floor"),
    ),
    Case(
        "num-calibrate-sparse-size-huge",
        "numbers",
        "lola calibrate --sparse-size 100000000 (beyond what any config accepts)",
        lambda ctx: cli([*CALIBRATE, "--sparse-size", "100000000", "--out", str(ctx.path("b.json"))]),
        refuse("--sparse-size"),
    ),
    _misread(
        "num-budgets-uniform-bool",
        "budgets file with uniform_sparse_size: true",
        _budgets(uniform=True, sizes=[[1, 0], [0, 0]]),
        "uniform_sparse_size",
        "uniform_sparse_size=1",
    ),
    _misread(
        "num-budgets-sizes-float",
        "budgets file with sparse_size_per_head [[8.0, 8.0], [8.0, 8.0]]",
        _budgets(sizes=[[8.0, 8.0], [8.0, 8.0]]),
        "sparse_size_per_head",
        "sparse_size_per_head=8",
    ),
    _misread("num-budgets-power-bool", "budgets file with power: true", _budgets(power=True), "power", "power=1.0"),
    Case(
        "num-budgets-scores-negative", "numbers", "budgets file with a negative retrieval score", _budgets(scores=[[-1.0, 2.0], [1.0, 1.0]]), refuse("scores")
    ),
    Case(
        "num-budgets-head-beyond-max-tokens",
        "numbers",
        "lola niah --budgets with one head of 2**26 slots (uniform 2**24, total within bounds)",
        lambda ctx: cli(
            [
                *NIAH_LOLA,
                "--window",
                "8",
                "--sparse-size",
                str(2**24),
                "--budgets",
                str(budgets_file(ctx.path("b.json"), uniform=2**24, sizes=[[2**26, 0], [0, 0]])),
                "--out",
                str(ctx.path("r")),
            ]
        ),
        refuse("--budgets|b.json"),
    ),
    Case(
        "num-maps-geometry-float",
        "numbers",
        "feature-map description with geometry.num_layers 2.0",
        _maps_edit(lambda m: m["geometry"].update(num_layers=2.0)),
        refuse("num_layers"),
    ),
    Case("num-maps-lora-rank-bool", "numbers", "stage-2 description with lora.rank true (the adapters have rank 2)", _lora_folder(True, 4.0), refuse("rank")),
    Case(
        "num-maps-lora-alpha-huge",
        "numbers",
        "stage-2 description with lora.alpha 1e30 (finite, > 0), then a forward",
        _lora_folder(2, 1e30),
        either("alpha", check=_finite),
    ),
    Case(
        "num-cache-lengths-huge",
        "numbers",
        "saved cache whose cumulative_lengths are 10**15 (model positions 8192), checksum recomputed, then decoding",
        _huge_lengths,
        refuse("cumulative_lengths", check=_decoded_anyway),
    ),
    Case("num-lm-eval-window-negative", "numbers", "lm-eval model_args window=-1", _lm_eval("pretrained=tiny-random-llama,window=-1"), refuse("window")),
    Case(
        "num-lm-eval-sparse-size-scientific",
        "numbers",
        "lm-eval model_args sparse_size=1e3 (parsed as the float 1000.0: a whole number, read as 1000)",
        _lm_eval("pretrained=tiny-random-llama,sparse_size=1e3"),
        either("sparse_size", check=lambda lm, ctx: ensure(lm.lola_config.sparse_size == 1000, f"read as {lm.lola_config.sparse_size!r}")),
    ),
    Case(
        "num-lm-eval-sparse-size-fraction",
        "numbers",
        "lm-eval model_args sparse_size=64.5",
        _lm_eval("pretrained=tiny-random-llama,sparse_size=64.5"),
        refuse("sparse_size"),
    ),
    Case(
        "num-lm-eval-window-negative-string-path",
        "numbers",
        "model_args 'window=-1' through simple_evaluate's string parser (an int there)",
        lambda ctx: lm_eval_model("pretrained=tiny-random-llama,window=-1", via="string"),
        refuse("window"),
    ),
    Case("num-lm-eval-scale-nan", "numbers", "lm-eval model_args scale=nan", _lm_eval("pretrained=tiny-random-llama,scale=nan"), refuse("scale")),
    Case(
        "num-lm-eval-batch-size-negative",
        "numbers",
        "lm-eval model_args batch_size=-1",
        _lm_eval("pretrained=tiny-random-llama,batch_size=-1"),
        refuse("batch_size"),
    ),
    Case(
        "num-lm-eval-max-length-zero", "numbers", "lm-eval model_args max_length=0", _lm_eval("pretrained=tiny-random-llama,max_length=0"), refuse("max_length")
    ),
    Case("num-niah-config-chunk-float", "numbers", "lola niah --config with chunk: 64.0", niah_config("chunk: 64.0\n"), refuse("--chunk")),
    Case("num-niah-config-window-inf", "numbers", "lola niah --config with window: .inf", niah_config("window: .inf\n"), refuse("--window")),
    Case(
        "num-perplexity-windows-zero",
        "numbers",
        "lola perplexity --windows 0",
        lambda ctx: cli([*PPL, "--text", str(hay(ctx)), "--windows", "0"]),
        refuse("--windows"),
    ),
    Case(
        "num-linearize-window-huge",
        "numbers",
        "lola linearize --quick --stage 1 --window 100000000",
        lambda ctx: cli(["linearize", "--quick", "--stage", "1", "--steps", "1", "--window", "100000000", "--out", str(ctx.path("lin"))]),
        refuse("--window"),
    ),
    Case(
        "num-linearize-feature-dim-huge",
        "numbers",
        "lola linearize --quick --stage 1 --feature-map hedgehog --feature-dim 100000",
        lambda ctx: cli(
            ["linearize", "--quick", "--stage", "1", "--steps", "1", "--feature-map", "hedgehog", "--feature-dim", "100000", "--out", str(ctx.path("lin"))]
        ),
        refuse("--feature-dim"),
    ),
]

# -- batch 2: written after them, to check that they hold ------------------------------------------

BATCH_2 = [
    _finite_run(
        "n2-config-window-factor-init-1e308",
        "LoLAConfig(window_factor_init=1e308) (finite), a layer built and run",
        {"window_factor_init": 1e308, "mixing": "lolcats"},
        "window_factor_init",
    ),
    _finite_run(
        "n2-expected-attention-rope-theta-1e308",
        "expected_attention with rope_theta=1e308 (finite, > 0), a layer run over 40 tokens",
        {"policy": "expected_attention", "policy_kwargs": {"rope_theta": 1e308}},
        "rope_theta",
    ),
    _numpy_scalar("n2-config-numpy-int64-window", "LoLAConfig(window=np.int64(8)) (a numpy scalar)", "window", np.int64(8), 8),
    _numpy_scalar(
        "n2-config-numpy-float32-scale", "LoLAConfig(scale=np.float32(0.25)) (a numpy scalar that is no Python float)", "scale", np.float32(0.25), 0.25
    ),
    Case("n2-config-scale-negative-zero", "numbers", "LoLAConfig(scale=-0.0)", lambda ctx: lola.LoLAConfig(scale=-0.0), refuse("scale")),
    _finite_run("n2-config-scale-subnormal", "LoLAConfig(scale=5e-324) (> 0, subnormal), a layer run over 40 tokens", {"scale": 5e-324}, "scale"),
    Case("n2-config-window-2pow63", "numbers", "LoLAConfig(window=2**63)", lambda ctx: lola.LoLAConfig(window=2**63), refuse("window")),
    _misread(
        "n2-config-bool-in-per-head-list",
        "LoLAConfig(window_per_head=[8, True])",
        lambda ctx: lola.LoLAConfig(window_per_head=[8, True]),
        "window_per_head",
        "window_per_head [8, 1]",
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
        niah_config('variants:\n  a:\n    layer_overrides:\n      "0": {scale: .nan}\n', argv=LOLA),
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
        _layer_run({"policy": "span", "policy_kwargs": {"radius": 2**70}}),
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
    _misread(
        "n2-linearize-config-window-bool", "lola.linearize.LinearizeConfig(window=True) through the API", _linearize_config(window=True), "window", "window=1"
    ),
    _misread("n2-linearize-config-steps-float", "lola.linearize.LinearizeConfig(steps=2.0) through the API", _linearize_config(steps=2.0), "steps", "steps=2"),
    _misread(
        "n2-finetune-config-lora-rank-bool",
        "lola.linearize.FinetuneConfig(lora_rank=True) through the API",
        _finetune_config(lora_rank=True),
        "lora_rank",
        "lora_rank=1",
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


# -- batch 3: written before the round-three fixes, to measure them ---------------------------------


def _bounded(**fields):
    return lambda ctx: lola.LoLAConfig(positions="bounded", **fields)


def _niah_yaml(text: str, argv: list[str] | None = None):
    """lola niah (:data:`NIAH`, or ``argv``) with ``--config opts.yaml`` holding ``text``."""
    return niah_config(text, argv=argv)


def _without(option: str) -> list[str]:
    """:data:`NIAH` without ``option`` and its value (a command-line option overrides the config file's)."""
    i = NIAH.index(option)
    return [*NIAH[:i], *NIAH[i + 2 :]]


def _export_pretrained(**kwargs):
    def run(ctx: Ctx):
        from lola.integrations.transformers.export import export_pretrained

        model, tok = tiny()
        export_pretrained(model, tok, ctx.path("e"), lola.LoLAConfig(window=8, sparse_size=4), **kwargs)
        return json.loads((ctx.path("e") / "config.json").read_text()).get("architectures")

    return run


def _calibrate_api(**kwargs):
    def run(ctx: Ctx):
        from lola.eval.calibrate import calibrate

        model, tok = tiny()
        return calibrate(model, tok, length=256, prompts=1, progress=False, **kwargs)

    return run


def _apply_force(value):
    def run(ctx: Ctx):
        from lola.integrations.transformers import apply_lola

        return apply_lola(tiny()[0], lola.LoLAConfig(window=8, sparse_size=4), force=value)

    return run


def _compose_bounded(rotary_dim: int | None):
    def run(ctx: Ctx):
        from lola.core.positions import RotaryEmbedding

        rotary = None if rotary_dim is None else RotaryEmbedding.from_theta(10000.0, rotary_dim)
        cfg = lola.LoLAConfig(window=8, sparse_size=4, sinks=2, chunk=4, positions="bounded", exact_distance=16, state_positions=32)
        attn = lola.compose(cfg, num_heads=4, head_dim=8, num_kv_heads=2, rotary=rotary)
        return attend(attn, 40)[0]

    return run


def _bounded_positions_object(**fields):
    def run(ctx: Ctx):
        from lola.core.positions import BoundedPositions, RotaryEmbedding

        return BoundedPositions(RotaryEmbedding.from_theta(10000.0, 8), **{"exact_distance": 16, "state_positions": 32, **fields})

    return run


def _export_config(text: str):
    def run(ctx: Ctx):
        return cli(["export", "--model", "tiny-random-llama", "--config", str(ctx.write("c.yaml", text)), "--out", str(ctx.path("e"))])

    return run


BATCH_3 = [
    Case("n3-config-exact-distance-zero", "numbers", "LoLAConfig(positions='bounded', exact_distance=0)", _bounded(exact_distance=0), refuse("exact_distance")),
    Case(
        "n3-config-state-positions-zero",
        "numbers",
        "LoLAConfig(positions='bounded', state_positions=0)",
        _bounded(state_positions=0),
        refuse("state_positions"),
    ),
    _misread(
        "n3-config-exact-distance-true",
        "LoLAConfig(positions='bounded', exact_distance=True)",
        _bounded(exact_distance=True),
        "exact_distance",
        "exact_distance=1",
    ),
    _misread(
        "n3-config-state-positions-float",
        "LoLAConfig(positions='bounded', state_positions=512.0)",
        _bounded(state_positions=512.0),
        "state_positions",
        "state_positions=512",
    ),
    Case(
        "n3-niah-exact-distance-beyond-context",
        "numbers",
        "lola niah --positions bounded --exact-distance 100000 on the tiny model (8192 positions)",
        lambda ctx: niah(ctx, "r", "--positions", "bounded", "--exact-distance", "100000"),
        refuse("--exact-distance"),
    ),
    Case(
        "n3-niah-state-positions-beyond-context",
        "numbers",
        "lola niah --positions bounded --state-positions 100000 on the tiny model (8192 positions)",
        lambda ctx: niah(ctx, "r", "--positions", "bounded", "--state-positions", "100000"),
        refuse("--state-positions"),
    ),
    Case(
        "n3-perplexity-state-positions-zero",
        "numbers",
        "lola perplexity --methods hybrid --positions bounded --state-positions 0",
        lambda ctx: ppl(ctx, perplexity(method="hybrid"), "--positions", "bounded", "--state-positions", "0"),
        refuse("--state-positions"),
    ),
    Case(
        "n3-probe-exact-distance-negative",
        "numbers",
        "lola probe --positions bounded --exact-distance -5",
        lambda ctx: probe(ctx, "p", "--positions", "bounded", "--exact-distance", "-5"),
        refuse("--exact-distance"),
    ),
    Case(
        "n3-niah-config-exact-distance-string",
        "numbers",
        "lola niah --config with positions: bounded and exact_distance: '512' (a string)",
        _niah_yaml("positions: bounded\nexact_distance: '512'\n"),
        refuse("exact_distance|--exact-distance"),
    ),
    Case("n3-niah-config-window-true", "numbers", "lola niah --config with window: true", _niah_yaml("window: true\n"), refuse("window|--window")),
    Case(
        "n3-niah-config-json-samples-float",
        "numbers",
        'lola niah --config opts.json with {"samples": 1.0} (no --samples on the command line)',
        niah_config('{"samples": 1.0}', "opts.json", argv=_without("--samples")),
        refuse("samples|--samples", check=described("the float 1.0 was read as samples 1")),
    ),
    Case(
        "n3-niah-config-batch-size-true",
        "numbers",
        "lola niah --config with batch_size: true",
        _niah_yaml("batch_size: true\n"),
        refuse("batch_size|--batch-size"),
    ),
    Case(
        "n3-niah-config-batch-size-float",
        "numbers",
        "lola niah --config with batch_size: 2.0",
        _niah_yaml("batch_size: 2.0\n"),
        refuse("batch_size|--batch-size"),
    ),
    Case("n3-niah-config-seed-true", "numbers", "lola niah --config with seed: true", _niah_yaml("seed: true\n"), refuse("seed|--seed")),
    Case(
        "n3-niah-config-max-new-tokens-string",
        "numbers",
        "lola niah --config with max_new_tokens: '1' (a string; no --max-new-tokens on the command line)",
        _niah_yaml("max_new_tokens: '1'\n", argv=_without("--max-new-tokens")),
        refuse("max_new_tokens|--max-new-tokens", check=described("the string '1' was read as max_new_tokens 1")),
    ),
    Case(
        "n3-niah-variant-affine-one",
        "numbers",
        "lola niah --config: a lola variant with mixing lolcats and affine: 1 (a number where a bool belongs)",
        _niah_yaml("variants:\n  a:\n    mixing: lolcats\n    affine: 1\n", argv=LOLA),
        refuse("affine"),
    ),
    Case(
        "n3-niah-variant-check-inputs-no",
        "numbers",
        "lola niah --config: a lola variant with check_inputs: 'no' (a string where a bool belongs)",
        _niah_yaml("variants:\n  a:\n    check_inputs: 'no'\n", argv=LOLA),
        refuse("check_inputs"),
    ),
    _misread("n3-config-affine-one", "LoLAConfig(mixing='lolcats', affine=1)", _config(mixing="lolcats", affine=1), "affine", "affine=True"),
    _misread("n3-config-check-inputs-zero", "LoLAConfig(check_inputs=0)", _config(check_inputs=0), "check_inputs", "check_inputs=False"),
    _misread(
        "n3-config-share-cap-from-true",
        "LoLAConfig(mixing='lola_authors', linear_share_cap=0.5, linear_share_cap_from=True)",
        _config(mixing="lola_authors", linear_share_cap=0.5, linear_share_cap_from=True),
        "linear_share_cap_from",
        "linear_share_cap_from=1",
    ),
    _misread("n3-apply-lola-force-one", "apply_lola(model, config, force=1)", _apply_force(1), "force", "force=True"),
    _misread("n3-apply-lola-force-zero", "apply_lola(model, config, force=0)", _apply_force(0), "force", "force=False"),
    _misread(
        "n3-export-pretrained-vllm-string-false",
        "export_pretrained(model, tok, out, config, vllm='false') (a truthy string)",
        _export_pretrained(vllm="false"),
        "vllm",
        "vllm=True: config.json names the vLLM plug-in's architecture",
    ),
    _misread(
        "n3-calibrate-api-sparse-size-true",
        "lola.eval.calibrate.calibrate(..., sparse_size=True)",
        _calibrate_api(sparse_size=True),
        "sparse_size",
        "sparse_size=1",
    ),
    Case(
        "n3-calibrate-api-power-nan",
        "numbers",
        "lola.eval.calibrate.calibrate(..., power=nan)",
        _calibrate_api(power=float("nan")),
        refuse("power", check=described("calibrated with power NaN")),
    ),
    _misread(
        "n3-sweep-spec-budget-a-float",
        "BudgetSweep(budgets=[0.125]) through the API (a float where a fraction string belongs)",
        lambda ctx: __import__("lola.eval.budget_sweep", fromlist=["BudgetSweep"]).BudgetSweep(budgets=[0.125]),
        "budgets",
        "budget '0.125'",
    ),
    _misread(
        "n3-lm-eval-exact-distance-fraction",
        "lm-eval model_args positions=bounded,exact_distance=512.5",
        lambda ctx: lm_eval_model("pretrained=tiny-random-llama,positions=bounded,exact_distance=512.5"),
        "exact_distance",
        "exact_distance=512",
    ),
    _misread(
        "n3-lm-eval-state-positions-true",
        "lm-eval model_args positions=bounded,state_positions=true",
        lambda ctx: lm_eval_model("pretrained=tiny-random-llama,positions=bounded,state_positions=true"),
        "state_positions",
        "state_positions=1",
    ),
    Case(
        "n3-export-config-exact-distance-beyond-context",
        "numbers",
        "lola export --config with positions: bounded and exact_distance: 100000 (the model holds 8192 positions)",
        _export_config("positions: bounded\nexact_distance: 100000\n"),
        refuse("exact_distance"),
    ),
    Case(
        "n3-compose-bounded-without-rotary",
        "numbers",
        "lola.compose of a bounded-positions config without rotary=, run over 40 tokens",
        _compose_bounded(None),
        refuse("rotary"),
    ),
    Case(
        "n3-compose-rotary-wider-than-head",
        "numbers",
        "lola.compose(bounded config, head_dim=8, rotary of 16 dimensions), run over 40 tokens",
        _compose_bounded(16),
        refuse("rotary"),
    ),
    _misread(
        "n3-bounded-positions-exact-distance-true",
        "lola.BoundedPositions(rotary, exact_distance=True, state_positions=32)",
        _bounded_positions_object(exact_distance=True),
        "exact_distance",
        "exact_distance=1",
    ),
]

CASES = [*in_batch(1, BATCH_1), *in_batch(2, BATCH_2), *in_batch(3, BATCH_3)]
