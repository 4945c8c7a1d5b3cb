"""Class 5: numbers.

inf, NaN, huge, negative, zero, bool-for-int and float-for-int values in config fields, policy
options, command-line options, budgets files, feature-map descriptions, saved caches and lm-eval
model_args; and sizes that would allocate far more memory than the work needs (the child runs
under an address-space limit, so such a case comes out ``oom`` unless lola refuses it first).
"""

from __future__ import annotations

import torch
from common import NIAH, PPL, budgets_file, continue_with, edit_cache, edit_json, hay, ids, lm_eval_model, niah, saved_cache, tiny, write_maps
from harness import Case, CaseFailure, Ctx, accept, cli, either, ensure, refuse

import lola


def _layer_run(cfg_kwargs: dict):
    """A standalone layer with ``cfg_kwargs`` over 40 tokens (so that steps and scoring run)."""

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


def _config(**kwargs):
    return lambda ctx: lola.LoLAConfig(**kwargs)


def _accepted_as(field: str, value):
    def check(cfg, ctx):
        raise CaseFailure(f"accepted, and read as {field}={value!r}")

    return check


def _budgets(**fields):
    def run(ctx: Ctx):
        from lola import budgets

        return budgets.load(budgets_file(ctx.path("b.json"), **fields))

    return run


def _maps_edit(change):
    """A feature-map folder whose lola_config.json is changed by ``change(meta)``, applied to the tiny model."""

    def run(ctx: Ctx):
        from lola.integrations.transformers import apply_lola

        write_maps(ctx.path("m"))
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
        for i, layer in enumerate(model.model.layers):
            w = layer.self_attn.q_proj.weight
            lora[f"base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight"] = torch.full((2, w.shape[1]), 0.01)
            lora[f"base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight"] = torch.full((w.shape[0], 2), 0.01)
        write_maps(ctx.path("m"), lora=lora, lora_spec=LoraSpec(rank=2, alpha=4.0))
        edit_json(ctx.path("m") / "lola_config.json", lambda m: m["lora"].update(rank=rank, alpha=alpha))
        apply_lola(model, lola.LoLAConfig(sparse_size=0), feature_maps=ctx.path("m"))
        with torch.no_grad():
            return model(ids(16, 256), use_cache=False).logits

    return run


def _huge_lengths(ctx: Ctx):
    from lola.integrations.transformers import LoLACache

    model, _ = saved_cache(ctx.path("c"))
    edit_cache(ctx.path("c"), change_meta=lambda m: m.update(cumulative_lengths=[10**15, 10**15]))
    return continue_with(model, LoLACache.load(ctx.path("c"), model))


def _decoded_anyway(out, ctx) -> None:
    _finite(out, ctx)
    raise CaseFailure("decoded at positions near 10**15 (RoPE far beyond the model's 8192) without a word")


def _lm_eval(args: str):
    def run(ctx: Ctx):
        return lm_eval_model(args)

    return run


def _niah_config(text: str):
    return lambda ctx: niah(ctx, "r", "--config", str(ctx.write("opts.yaml", text)))


def _status_0(result, ctx):
    ensure(result.status == 0, f"exit {result.status}")


CALIBRATE = ["calibrate", "--model", "tiny-random-llama", "--length", "256", "--prompts", "1"]
LOLA = [*NIAH[:-1], "lola"]


CASES = [
    Case(
        "num-config-scale-huge",
        "numbers",
        "LoLAConfig(scale=1e300) (finite, > 0), a layer run over 40 tokens",
        _layer_run({"scale": 1e300}),
        either("scale", check=_finite),
    ),
    Case(
        "num-policy-random-seed-bool",
        "numbers",
        "LoLAConfig(policy='random', policy_kwargs={'seed': True})",
        _config(policy="random", policy_kwargs={"seed": True}),
        refuse("seed", check=_accepted_as("seed", 1)),
    ),
    Case(
        "num-policy-span-radius-bool",
        "numbers",
        "LoLAConfig(policy='span', policy_kwargs={'radius': True})",
        _config(policy="span", policy_kwargs={"radius": True}),
        refuse("radius", check=_accepted_as("radius", 1)),
    ),
    Case(
        "num-policy-fusion-weight-bool",
        "numbers",
        "fusion policy with weights [True, 1.0]",
        _config(policy="fusion", policy_kwargs={"policies": ["sre", "key_norm"], "weights": [True, 1.0]}),
        refuse("weights", check=_accepted_as("weights[0]", 1.0)),
    ),
    Case(
        "num-policy-fusion-weights-huge",
        "numbers",
        "fusion policy with weights [1e308, 1e308] (finite), a layer run over 40 tokens",
        _layer_run({"policy": "fusion", "policy_kwargs": {"policies": ["sre", "key_norm"], "weights": [1e308, 1e308]}}),
        either("weights", check=_finite),
    ),
    Case(
        "num-policy-rope-theta-tiny",
        "numbers",
        "expected_attention with rope_theta=1e-300 (> 0), a layer run over 40 tokens",
        _layer_run({"policy": "expected_attention", "policy_kwargs": {"rope_theta": 1e-300}}),
        either("rope_theta", check=_finite),
    ),
    Case(
        "num-policy-half-life-tiny",
        "numbers",
        "expected_attention with query_half_life=1e-300 (> 0), a layer run over 40 tokens",
        _layer_run({"policy": "expected_attention", "policy_kwargs": {"query_half_life": 1e-300}}),
        either("query_half_life", check=_finite),
    ),
    Case("num-niah-sinks-negative", "numbers", "lola niah --sinks -1", lambda ctx: niah(ctx, "r", "--sinks", "-1"), refuse("--sinks")),
    Case("num-niah-chunk-zero", "numbers", "lola niah --chunk 0", lambda ctx: niah(ctx, "r", "--chunk", "0"), refuse("--chunk")),
    Case(
        "num-niah-max-new-tokens-beyond-length",
        "numbers",
        "lola niah --lengths 400 --max-new-tokens 100000",
        lambda ctx: niah(ctx, "r", "--max-new-tokens", "100000"),
        refuse("--max-new-tokens|max_new_tokens"),
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
        lambda ctx: cli([*LOLA, "--window", "8", "--sparse-size", "16000000", "--out", str(ctx.path("r"))]),
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
    Case(
        "num-budgets-uniform-bool",
        "numbers",
        "budgets file with uniform_sparse_size: true",
        _budgets(uniform=True, sizes=[[1, 0], [0, 0]]),
        refuse("uniform_sparse_size", check=_accepted_as("uniform_sparse_size", 1)),
    ),
    Case(
        "num-budgets-sizes-float",
        "numbers",
        "budgets file with sparse_size_per_head [[8.0, 8.0], [8.0, 8.0]]",
        _budgets(sizes=[[8.0, 8.0], [8.0, 8.0]]),
        refuse("sparse_size_per_head", check=_accepted_as("sparse_size_per_head", 8)),
    ),
    Case(
        "num-budgets-power-bool",
        "numbers",
        "budgets file with power: true",
        _budgets(power=True),
        refuse("power", check=_accepted_as("power", 1.0)),
    ),
    Case(
        "num-budgets-scores-negative",
        "numbers",
        "budgets file with a negative retrieval score",
        _budgets(scores=[[-1.0, 2.0], [1.0, 1.0]]),
        refuse("scores"),
    ),
    Case(
        "num-budgets-head-beyond-max-tokens",
        "numbers",
        "lola niah --budgets with one head of 2**26 slots (uniform 2**24, total within bounds)",
        lambda ctx: cli(
            [
                *LOLA,
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
    Case(
        "num-maps-lora-rank-bool",
        "numbers",
        "stage-2 description with lora.rank true (the adapters have rank 2)",
        _lora_folder(True, 4.0),
        refuse("rank"),
    ),
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
        "num-lm-eval-max-length-zero",
        "numbers",
        "lm-eval model_args max_length=0",
        _lm_eval("pretrained=tiny-random-llama,max_length=0"),
        refuse("max_length"),
    ),
    Case("num-niah-config-chunk-float", "numbers", "lola niah --config with chunk: 64.0", _niah_config("chunk: 64.0\n"), refuse("--chunk")),
    Case("num-niah-config-window-inf", "numbers", "lola niah --config with window: .inf", _niah_config("window: .inf\n"), refuse("--window")),
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
