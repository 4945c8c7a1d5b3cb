"""Adversarial cases of class ``messages``: unclear messages.

Batch 1. Bad inputs whose refusal is expected anyway; the question is the message: one line on the
command line, naming the option, model_arg or file at fault (``--needle``, ``--budgets``,
``model_args budgets``), never a bare ``KeyError`` text or a traceback.

Batch 2. Refusals expected anyway; the question is the message: one line on the command line,
naming the option, model_arg, file or plug-in at fault. Format specs and conversions in templates
(past the placeholder check), a config file too deeply nested for the JSON parser, values of the
wrong type inside a config file (a variant's budgets, lm-eval's lola_config), a model folder
without a tokenizer, and plug-ins whose failure or size surfaces inside lola.

Batch 3. Refusals expected anyway, about files and options of this round: damaged feature-map
folders given to niah, perplexity, calibrate, fit-scorer, export and linearize's stage 2; budgets
files damaged, missing or of another model given to perplexity and to a variant; the position
options (a typo, limits without bounded positions, a distance shorter than the window, a model
whose RoPE cannot be bounded); one folder kind given where another is expected (a feature-map
folder as a cache or a model, a cache as feature maps). Each must name the file or option on one
line.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import lola

from ...common import cut, edit_safetensors, rehash_maps, write_random_maps
from ..builders import (
    EXPORT,
    LINEARIZE,
    LOLA,
    NIAH,
    PPL,
    PROBE,
    SWEEP,
    budgets_file,
    cli_q,
    fit,
    hay,
    hf_folder,
    layer_and_state,
    lm_eval_model,
    niah,
    niah_config,
    perplexity,
    policy,
    ppl,
    saved_cache,
    schedule,
    tiny,
)
from ..harness import Case, Ctx, cli, export, in_batch, refuse

QUESTION = ["--question", "What is the code of {key}?"]


def _needle(needle: str, *extra: str):
    return lambda ctx: niah(ctx, "r", "--needle", needle, *QUESTION, *extra)


def _lm_args(args: str):
    def run(ctx: Ctx):
        return lm_eval_model(args)

    return run


@dataclass(frozen=True)
class _KeyErrorPolicy:
    """A policy plug-in whose score() has a bug: a dict lookup that fails."""

    needs_attention = False

    def score(self, candidates, ctx):
        return {}["bucket"]


def _plugin_bug(ctx: Ctx):
    with policy("buggy_plugin", _KeyErrorPolicy):
        return cli([*PPL, "--methods", "lola", "--policy", "buggy_plugin", "--text", str(ctx.write("hay.txt", "The sea is wide. " * 300))])


def _fusion_unknown_part(ctx: Ctx):
    import lola

    return lola.LoLAConfig(policy="fusion", policy_kwargs={"policies": ["sre", "nosuch"]})


def _budgets_wrong_heads(ctx: Ctx):
    path = budgets_file(ctx.path("b.json"), layers=2, kv=3)
    return cli([*LOLA, "--budgets", str(path), "--out", str(ctx.path("r"))])


def _load_list_state():
    attn, _, sd = layer_and_state()
    sd["window.k"] = sd["window.k"].tolist()
    state = attn.new_state()
    state.load_state_dict(sd)
    return torch.tensor(0)


def _lm_config(text: str, name: str = "c.yaml"):
    def run(ctx: Ctx):
        from lola.integrations.lm_eval.model import LoLALM

        return LoLALM(pretrained="tiny-random-llama", device="cpu", lola_config=str(ctx.write(name, text)))

    return run


def _schedule_plugin(until, period: int = 4):
    """lola niah --methods lola with a variant whose schedule is a plug-in (period ``period``)
    answering ``until(seen)``."""

    def run(ctx: Ctx):
        with schedule("odd_schedule", until, period):
            return niah_config("variants:\n  s:\n    schedule: odd_schedule\n", argv=LOLA)(ctx)

    return run


def _folder_without_tokenizer(ctx: Ctx):
    folder = hf_folder(ctx.path("m"), "llama")
    for p in folder.iterdir():
        if "token" in p.name:
            p.unlink()
    return cli_q(
        ["niah", "--model", str(folder), "--lengths", "400", "--samples", "1", "--max-new-tokens", "1", "--methods", "full", "--out", str(ctx.path("r"))]
    )


def _export_garbled_config(ctx: Ctx):
    folder = hf_folder(ctx.path("m"), "llama")
    (folder / "config.json").write_text('{"model_type": "llama", "max_position_embeddings": ')
    return export(["--out", str(ctx.path("tasks")), "--model", str(folder), "--lengths", "512", "--samples", "1"])


def _window_factor_init_lm_eval(ctx: Ctx):
    return lm_eval_model("pretrained=tiny-random-llama,window_factor_init=1e308")


def _maps_for_wrong_model_via_perplexity(ctx: Ctx):
    """A stage-1 folder of the tiny model given to lola perplexity on a model folder of another shape."""
    write_random_maps(ctx.path("maps"))
    folder = hf_folder(ctx.path("m"), "llama", num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    return cli_q(perplexity(str(folder), "hybrid", "--feature-maps", str(ctx.path("maps")), "--text", str(hay(ctx))))


def _cache_load_other_dtype(ctx: Ctx):
    """A cache saved by the float32 model, loaded after model.to(bfloat16)."""
    from lola.integrations.transformers import LoLACache

    model, _ = saved_cache(ctx.path("c"))
    model.to(torch.bfloat16)
    return LoLACache.load(ctx.path("c"), model)


def _apply_config_dict(ctx: Ctx):
    from lola.integrations.transformers import apply_lola

    model, _ = tiny()
    return apply_lola(model, {"window": 8})


# -- batch 1: written before the fixes it led to ----------------------------------------------------

BATCH_1 = [
    Case(
        "msg-needle-unknown-placeholder",
        "messages",
        "lola niah --needle '{foo} {key} {value}'",
        _needle("{foo} {key} {value}"),
        refuse("--needle|needle template", "{foo}"),
    ),
    Case(
        "msg-question-value-placeholder",
        "messages",
        "lola niah --question 'What is {value} of {key}?' ({value} is the needle's only)",
        lambda ctx: niah(ctx, "r", "--needle", "The code of {key} is {value}.", "--question", "What is {value} of {key}?"),
        refuse("--question|question template", "{value}"),
    ),
    Case(
        "msg-answer-prefix-value-placeholder",
        "messages",
        "lola niah --answer-prefix ' The code is {value}'",
        _needle("The code of {key} is {value}.", "--answer-prefix", " The code is {value}"),
        refuse("--answer-prefix|answer_prefix template", "{value}"),
    ),
    Case(
        "msg-needle-positional-placeholder",
        "messages",
        "lola niah --needle '{0}: {key} {value}'",
        _needle("{0}: {key} {value}"),
        refuse("--needle|needle template", "{0}"),
    ),
    Case("msg-needle-lone-brace", "messages", "lola niah --needle '{key} is {value} {'", _needle("{key} is {value} {"), refuse("--needle|needle template")),
    Case(
        "msg-answer-prefix-without-question",
        "messages",
        "lola niah --answer-prefix alone (it needs --question)",
        lambda ctx: niah(ctx, "r", "--answer-prefix", " The code is"),
        refuse("--answer-prefix|answer_prefix", "--question|question"),
    ),
    Case(
        "msg-budgets-of-another-model",
        "messages",
        "lola niah --methods lola --budgets smollm2-135m-instruct on tiny-random-llama",
        lambda ctx: cli([*LOLA, "--budgets", "smollm2-135m-instruct", "--out", str(ctx.path("r"))]),
        refuse("--budgets", "smollm2-135m-instruct"),
    ),
    Case(
        "msg-budgets-file-wrong-heads",
        "messages",
        "lola niah --methods lola --budgets b.json made for 2 layers x 3 K/V heads (the model has 2)",
        _budgets_wrong_heads,
        refuse("--budgets", "b.json"),
    ),
    Case(
        "msg-budgets-of-another-model-lm-eval",
        "messages",
        "lm-eval model_args budgets=smollm2-135m-instruct on tiny-random-llama",
        _lm_args("pretrained=tiny-random-llama,budgets=smollm2-135m-instruct"),
        refuse("budgets", "smollm2-135m-instruct"),
    ),
    Case(
        "msg-feature-maps-of-another-model",
        "messages",
        "lola niah --methods window --feature-maps smollm2-135m-instruct on tiny-random-llama",
        lambda ctx: cli([*NIAH, "--feature-maps", "smollm2-135m-instruct", "--out", str(ctx.path("r"))]),
        refuse("--feature-maps|feature maps in", "another model"),
    ),
    Case(
        "msg-perplexity-feature-maps-of-another-model",
        "messages",
        "lola perplexity --feature-maps smollm2-135m-instruct on tiny-random-llama",
        lambda ctx: cli([*PPL, "--methods", "hybrid", "--feature-maps", "smollm2-135m-instruct", "--text", str(ctx.write("t.txt", "The sea is wide. " * 300))]),
        refuse("--feature-maps|feature maps in", "another model"),
    ),
    Case(
        "msg-export-out-is-a-file",
        "messages",
        "export-niah --out afile (a plain file)",
        lambda ctx: export(["--out", str(ctx.write("afile", "mine")), *EXPORT]),
        refuse("--out", "afile"),
    ),
    Case(
        "msg-export-needle-unknown-placeholder",
        "messages",
        "export-niah --needle '{foo} {key} {value}'",
        lambda ctx: export(["--out", str(ctx.path("tasks")), *EXPORT, "--needle", "{foo} {key} {value}", *QUESTION]),
        refuse("--needle|needle template", "{foo}"),
    ),
    Case(
        "msg-export-samples-zero",
        "messages",
        "export-niah --samples 0",
        lambda ctx: export(["--out", str(ctx.path("tasks")), "--model", "tiny-random-llama", "--lengths", "512", "--samples", "0"]),
        refuse("--samples"),
    ),
    Case(
        "msg-lm-eval-budgets-a-number",
        "messages",
        "lm-eval model_args budgets=5 (lm-eval parses it as an int)",
        _lm_args("pretrained=tiny-random-llama,budgets=5"),
        refuse("budgets"),
    ),
    Case(
        "msg-lm-eval-feature-maps-a-number",
        "messages",
        "lm-eval model_args feature_maps=7",
        _lm_args("pretrained=tiny-random-llama,feature_maps=7"),
        refuse("feature_maps"),
    ),
    Case(
        "msg-lm-eval-lola-config-a-number",
        "messages",
        "lm-eval model_args lola_config=3",
        _lm_args("pretrained=tiny-random-llama,lola_config=3"),
        refuse("lola_config"),
    ),
    Case(
        "msg-lm-eval-lola-config-missing-file",
        "messages",
        "lm-eval model_args lola_config=missing.yaml",
        _lm_args("pretrained=tiny-random-llama,lola_config=missing.yaml"),
        refuse("missing.yaml"),
    ),
    Case("msg-lm-eval-chunk-zero", "messages", "lm-eval model_args chunk=0", _lm_args("pretrained=tiny-random-llama,chunk=0"), refuse("chunk")),
    Case(
        "msg-fusion-unknown-part",
        "messages",
        "LoLAConfig(policy='fusion', policy_kwargs={'policies': ['sre', 'nosuch']})",
        _fusion_unknown_part,
        refuse("nosuch"),
    ),
    Case(
        "msg-cli-fusion-unknown-part",
        "messages",
        "lola niah --config with a lola variant fusing an unknown policy 'nosuch'",
        niah_config("variants:\n  f:\n    policy: fusion\n    policy_kwargs:\n      policies: [sre, nosuch]\n", argv=LOLA),
        refuse("nosuch"),
    ),
    Case(
        "msg-policy-plugin-keyerror",
        "messages",
        "lola perplexity --policy buggy_plugin whose score() raises KeyError('bucket')",
        _plugin_bug,
        refuse("buggy_plugin"),
    ),
    Case(
        "msg-perplexity-text-too-short",
        "messages",
        "lola perplexity --text small.txt whose held-out tenth is shorter than one --lengths window",
        lambda ctx: cli([*PPL, "--text", str(ctx.write("small.txt", "Tiny text. " * 40))]),
        refuse("small.txt|--text"),
    ),
    Case(
        "msg-niah-window-not-an-int",
        "messages",
        "lola niah --window 8.5 (argparse rejects it)",
        lambda ctx: niah(ctx, "r", "--window", "8.5"),
        refuse("--window"),
    ),
    Case(
        "msg-niah-variants-not-a-mapping",
        "messages",
        "lola niah --config with variants: [1, 2]",
        niah_config("variants: [1, 2]\n"),
        refuse("--variants"),
    ),
    Case(
        "msg-state-from-file-wrong-type",
        "messages",
        "LoLAMemory.load_state_dict with a list where a tensor belongs",
        lambda ctx: _load_list_state(),
        refuse("window.k"),
    ),
]

# -- batch 2: written after them, to check that they hold ------------------------------------------

BATCH_2 = [
    Case(
        "m2-needle-format-spec",
        "messages",
        "lola niah --needle 'The code of {key} is {value:d}.' (a format spec a str cannot take)",
        _needle("The code of {key} is {value:d}."),
        refuse("--needle|needle template"),
    ),
    Case(
        "m2-needle-nested-format-spec",
        "messages",
        "lola niah --needle 'The code of {key} is {value:{key}}.' (a placeholder inside a format spec)",
        _needle("The code of {key} is {value:{key}}."),
        refuse("--needle|needle template"),
    ),
    Case(
        "m2-question-unknown-conversion",
        "messages",
        "lola niah --question 'What is the code of {key!z}?' (no conversion z)",
        lambda ctx: niah(ctx, "r", "--needle", "The code of {key} is {value}.", "--question", "What is the code of {key!z}?"),
        refuse("--question|question template"),
    ),
    Case(
        "m2-answer-prefix-format-spec",
        "messages",
        "lola niah --answer-prefix ' The code of {key:>99999999999} is' (a width no string can take)",
        lambda ctx: niah(ctx, "r", "--needle", "The code of {key} is {value}.", *QUESTION, "--answer-prefix", " The code of {key:>99999999999} is"),
        refuse("--answer-prefix|answer_prefix template"),
    ),
    Case(
        "m2-export-needle-format-spec",
        "messages",
        "export-niah --needle 'The code of {key} is {value:d}.'",
        lambda ctx: export(["--out", str(ctx.path("tasks")), *EXPORT, "--needle", "The code of {key} is {value:d}.", *QUESTION]),
        refuse("--needle|needle template"),
    ),
    Case(
        "m2-config-json-nested-too-deep",
        "messages",
        "lola niah --config deep.json: variants nested 100,000 lists deep",
        niah_config('{"variants": ' + "[" * 100_000 + "]" * 100_000 + "}", "deep.json"),
        refuse("--config|deep.json"),
    ),
    Case(
        "m2-config-variant-budgets-a-number",
        "messages",
        "lola niah --methods lola --config with a variant whose budgets is 5",
        niah_config("variants:\n  a:\n    budgets: 5\n", argv=LOLA),
        refuse("budgets"),
    ),
    Case(
        "m2-lm-eval-lola-config-budgets-a-number",
        "messages",
        "lm-eval LoLALM(lola_config=c.yaml) whose file says budgets: 5",
        _lm_config("window: 8\nbudgets: 5\n"),
        refuse("budgets"),
    ),
    Case(
        "m2-lm-eval-lola-config-feature-maps-a-number",
        "messages",
        "lm-eval LoLALM(lola_config=c.yaml) whose file says feature_maps: 7",
        _lm_config("window: 8\nfeature_maps: 7\n"),
        refuse("feature_maps"),
    ),
    Case(
        "m2-lm-eval-window-factor-init-overflow",
        "messages",
        "lm-eval model_args window_factor_init=1e308 (accepted by the config, overflows float32 in the layer)",
        _window_factor_init_lm_eval,
        refuse("window_factor_init"),
    ),
    Case(
        "m2-schedule-plugin-python-int",
        "messages",
        "lola niah: a variant's schedule plug-in answers the Python int 4 (not a tensor)",
        _schedule_plugin(lambda seen: 4),
        refuse("odd_schedule|Plugin"),
    ),
    Case(
        "m2-schedule-plugin-keyerror",
        "messages",
        "lola niah: a variant's schedule plug-in raises KeyError('bucket')",
        _schedule_plugin(lambda seen: {}["bucket"]),
        refuse("odd_schedule|Plugin"),
    ),
    Case(
        "m2-schedule-plugin-huge-period",
        "messages",
        "lola niah: a variant's schedule plug-in has period 2**40 (it sizes the window's buffer)",
        _schedule_plugin(lambda seen: torch.ones_like(seen), period=2**40),
        refuse("odd_schedule|period"),
    ),
    Case(
        "m2-niah-model-folder-without-tokenizer",
        "messages",
        "lola niah --model FOLDER holding config.json and weights but no tokenizer files",
        _folder_without_tokenizer,
        refuse("--model"),
    ),
    Case(
        "m2-export-model-folder-garbled-config",
        "messages",
        "export-niah --model FOLDER whose config.json is cut short (its tokenizer is whole)",
        _export_garbled_config,
        refuse("--model|config.json"),
    ),
    Case(
        "m2-perplexity-maps-of-another-shape-folder-model",
        "messages",
        "lola perplexity --model FOLDER (2 heads x 16) --feature-maps of the tiny model (4 heads x 16)",
        _maps_for_wrong_model_via_perplexity,
        refuse("--feature-maps|maps", "another model"),
    ),
    Case(
        "m2-cache-load-after-model-cast",
        "messages",
        "LoLACache.load of a float32 model's cache after model.to(bfloat16)",
        _cache_load_other_dtype,
        refuse("cache|weights"),
    ),
    Case(
        "m2-apply-lola-config-a-dict",
        "messages",
        "apply_lola(model, {'window': 8}) (a dict, not a LoLAConfig)",
        _apply_config_dict,
        refuse("config", "LoLAConfig"),
    ),
    Case(
        "m2-perplexity-text-name-with-newline-missing",
        "messages",
        "lola perplexity --text 'miss\\ning.txt' (no such file; a newline in its name)",
        lambda ctx: cli([*PPL, "--text", str(ctx.path("miss\ning.txt"))]),
        refuse("ing.txt"),
    ),
]


# -- batch 3: written before the round-three fixes, to measure them ---------------------------------


def _maps(ctx: Ctx, edit=None) -> str:
    """A feature-map folder ``mymaps`` for the tiny model, changed by ``edit(folder)``; its path."""
    folder = write_random_maps(ctx.path("mymaps"))
    if edit is not None:
        edit(folder)
    return str(folder)


def _cut_description(folder) -> None:
    cut(folder / "lola_config.json")


def _drop_layer_1_map(folder) -> None:
    edit_safetensors(folder / "feature_maps.safetensors", tensors=lambda t: t.pop("model.layers.1.self_attn.feature_map_k.mlp.layer"))
    rehash_maps(folder)


def _nan_map(folder) -> None:
    def change(t):
        key = "model.layers.0.self_attn.feature_map_q.mlp.layer"
        t[key] = torch.full_like(t[key], float("nan"))

    edit_safetensors(folder / "feature_maps.safetensors", tensors=change)
    rehash_maps(folder)


def _geometry_heads_8(folder) -> None:
    import json

    path = folder / "lola_config.json"
    meta = json.loads(path.read_text())
    meta["geometry"]["num_heads"] = 8
    path.write_text(json.dumps(meta))


def _niah_maps(edit):
    return lambda ctx: cli([*NIAH, "--feature-maps", _maps(ctx, edit), "--out", str(ctx.path("r"))])


def _budgets_json(ctx: Ctx, **fields) -> str:
    return str(budgets_file(ctx.path("b.json"), **fields))


PPL_LOLA = perplexity(method="lola")


def _dynamic_rope_folder(ctx: Ctx):
    folder = hf_folder(ctx.path("m"), "llama", rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    argv = ["niah", "--model", str(folder), "--lengths", "400", "--samples", "1", "--max-new-tokens", "1", "--methods", "window", "--positions", "bounded"]
    return cli_q([*argv, "--out", str(ctx.path("r"))])


def _cache_load_from(ctx: Ctx):
    from lola.integrations.transformers import LoLACache, apply_lola

    model, _ = tiny()
    apply_lola(model, lola.LoLAConfig(window=8, sparse_size=4))
    return LoLACache.load(_maps(ctx), model)


def _from_pretrained_maps(ctx: Ctx):
    from lola.integrations.transformers import from_pretrained

    return from_pretrained(_maps(ctx))


def _apply_cache_folder_as_maps(ctx: Ctx):
    from lola.integrations.transformers import apply_lola

    saved_cache(ctx.path("c"))
    model, _ = tiny()
    return apply_lola(model, lola.LoLAConfig(window=8, sparse_size=0), feature_maps=ctx.path("c"))


BATCH_3 = [
    Case(
        "m3-niah-maps-description-cut",
        "messages",
        "lola niah --feature-maps mymaps whose lola_config.json is cut in half",
        _niah_maps(_cut_description),
        refuse("mymaps", "lola_config.json"),
    ),
    Case(
        "m3-niah-maps-tensor-missing",
        "messages",
        "lola niah --feature-maps mymaps whose feature_maps.safetensors lacks layer 1's key map (sums recomputed)",
        _niah_maps(_drop_layer_1_map),
        refuse("mymaps|feature_maps.safetensors", "layers.1|layer 1"),
    ),
    Case(
        "m3-perplexity-maps-geometry-edited",
        "messages",
        "lola perplexity --methods hybrid --feature-maps mymaps whose description says 8 heads (the tensors hold 4)",
        lambda ctx: ppl(ctx, perplexity(method="hybrid"), "--feature-maps", _maps(ctx, _geometry_heads_8)),
        refuse("mymaps"),
    ),
    Case(
        "m3-calibrate-maps-description-cut",
        "messages",
        "lola calibrate --feature-maps mymaps whose lola_config.json is cut in half",
        lambda ctx: cli(
            [
                "calibrate",
                "--model",
                "tiny-random-llama",
                "--length",
                "256",
                "--prompts",
                "1",
                "--feature-maps",
                _maps(ctx, _cut_description),
                "--out",
                str(ctx.path("b.json")),
            ]
        ),
        refuse("--feature-maps|mymaps", "lola_config.json"),
    ),
    Case(
        "m3-fit-scorer-maps-missing",
        "messages",
        "lola fit-scorer --feature-maps no_such_maps (no such folder)",
        lambda ctx: fit(ctx, "s.safetensors", "--feature-maps", str(ctx.path("no_such_maps"))),
        refuse("no_such_maps"),
    ),
    Case(
        "m3-export-maps-tensor-nan",
        "messages",
        "lola export --feature-maps mymaps holding a NaN map (sums recomputed)",
        lambda ctx: cli(["export", "--model", "tiny-random-llama", "--feature-maps", _maps(ctx, _nan_map), "--out", str(ctx.path("e"))]),
        refuse("mymaps|feature_maps.safetensors", "layers.0|layer 0"),
    ),
    Case(
        "m3-linearize-stage-2-maps-cut",
        "messages",
        "lola linearize --stage 2 --feature-maps mymaps (its lola_config.json cut in half) --out lin2",
        lambda ctx: cli(
            ["linearize", "--quick", "--stage", "2", "--stage2-steps", "1", "--feature-maps", _maps(ctx, _cut_description), "--out", str(ctx.path("lin2"))]
        ),
        refuse("mymaps", "lola_config.json"),
    ),
    Case(
        "m3-niah-budgets-power-a-word",
        "messages",
        'lola niah --methods lola --budgets b.json whose power is "half"',
        lambda ctx: cli([*LOLA, "--budgets", _budgets_json(ctx, power="half"), "--out", str(ctx.path("r"))]),
        refuse("b.json", "power"),
    ),
    Case(
        "m3-perplexity-budgets-missing",
        "messages",
        "lola perplexity --methods lola --budgets missing.json (no such file)",
        lambda ctx: ppl(ctx, PPL_LOLA, "--budgets", str(ctx.path("missing.json"))),
        refuse("missing.json"),
    ),
    Case(
        "m3-perplexity-budgets-other-heads",
        "messages",
        "lola perplexity --methods lola --budgets b.json made for 3 K/V heads (the model has 2)",
        lambda ctx: ppl(ctx, PPL_LOLA, "--budgets", _budgets_json(ctx, kv=3)),
        refuse("--budgets", "b.json"),
    ),
    Case(
        "m3-perplexity-budgets-negative-score",
        "messages",
        "lola perplexity --methods lola --budgets b.json with a negative retrieval score",
        lambda ctx: ppl(ctx, PPL_LOLA, "--budgets", _budgets_json(ctx, scores=[[-1.0, 1.0], [1.0, 1.0]])),
        refuse("b.json", "scores"),
    ),
    Case(
        "m3-niah-variant-budgets-missing",
        "messages",
        "lola niah --config: a lola variant whose budgets is missing.json (no such file)",
        niah_config("variants:\n  a:\n    budgets: missing.json\n", argv=LOLA),
        refuse("missing.json"),
    ),
    Case(
        "m3-niah-config-positions-typo",
        "messages",
        "lola niah --config with positions: bound (not absolute or bounded)",
        niah_config("positions: bound\n"),
        refuse("positions", "bound"),
    ),
    Case(
        "m3-niah-share-cap-from-without-cap",
        "messages",
        "lola niah --methods lola --linear-share-cap-from 64 (no --linear-share-cap)",
        lambda ctx: cli([*LOLA, "--linear-share-cap-from", "64", "--out", str(ctx.path("r"))]),
        refuse("--linear-share-cap-from"),
    ),
    Case(
        "m3-perplexity-exact-distance-without-bounded",
        "messages",
        "lola perplexity --methods lola --exact-distance 512 (positions left absolute)",
        lambda ctx: ppl(ctx, PPL_LOLA, "--exact-distance", "512"),
        refuse("--exact-distance", "--positions"),
    ),
    Case(
        "m3-niah-state-positions-without-bounded",
        "messages",
        "lola niah --methods lola --state-positions 512 (positions left absolute)",
        lambda ctx: cli([*LOLA, "--state-positions", "512", "--out", str(ctx.path("r"))]),
        refuse("--state-positions", "--positions"),
    ),
    Case(
        "m3-niah-exact-distance-below-window",
        "messages",
        "lola niah --methods lola --window 8 --positions bounded --exact-distance 4",
        lambda ctx: cli([*LOLA, "--positions", "bounded", "--exact-distance", "4", "--out", str(ctx.path("r"))]),
        refuse("--exact-distance"),
    ),
    Case(
        "m3-niah-bounded-on-dynamic-rope",
        "messages",
        "lola niah --model FOLDER --positions bounded, the folder a Llama with dynamic RoPE scaling",
        _dynamic_rope_folder,
        refuse("--positions|bounded", "dynamic"),
    ),
    Case(
        "m3-lm-eval-lola-config-exact-distance-absolute",
        "messages",
        "lm-eval LoLALM(lola_config=c.yaml) whose file sets exact_distance: 512 with absolute positions",
        _lm_config("window: 8\nexact_distance: 512\n"),
        refuse("exact_distance", "c.yaml"),
    ),
    Case(
        "m3-probe-methods-without-state",
        "messages",
        "lola probe --methods full window (no method holds a state to probe)",
        lambda ctx: cli([*PROBE[:-1], "full", "window", "--out", str(ctx.path("p"))]),
        refuse("--methods"),
    ),
    Case(
        "m3-sweep-budget-leaves-no-room",
        "messages",
        "lola sweep --budgets 1/400 (one exact token of 400: no room beside 4 sinks)",
        lambda ctx: cli([*SWEEP, "--budgets", "1/400", "--out", str(ctx.path("s"))]),
        refuse("--budgets", "1/400"),
    ),
    Case(
        "m3-fit-scorer-min-future-beyond-length",
        "messages",
        "lola fit-scorer --length 96 --min-future 1000 (no key has 1000 queries after it in 96 tokens)",
        lambda ctx: fit(ctx, "s.safetensors", "--min-future", "1000"),
        refuse("--min-future"),
    ),
    Case(
        "m3-linearize-text-empty-folder",
        "messages",
        "lola linearize --text emptydir (a folder holding no text)",
        lambda ctx: (ctx.path("emptydir").mkdir(), cli([*LINEARIZE, "--text", str(ctx.path("emptydir")), "--out", str(ctx.path("lin"))]))[1],
        refuse("--text", "emptydir"),
    ),
    Case(
        "m3-export-config-window-a-string",
        "messages",
        "lola export --config c.yaml with window: '64' (a string)",
        lambda ctx: cli(["export", "--model", "tiny-random-llama", "--config", str(ctx.write("c.yaml", "window: '64'\n")), "--out", str(ctx.path("e"))]),
        refuse("--config|c.yaml", "window"),
    ),
    Case(
        "m3-cache-load-from-maps-folder",
        "messages",
        "LoLACache.load(mymaps, model) where mymaps is a feature-map folder",
        _cache_load_from,
        refuse("mymaps", "cache.json"),
    ),
    Case(
        "m3-from-pretrained-maps-folder",
        "messages",
        "lola.from_pretrained(mymaps) where mymaps is a feature-map folder (no model)",
        _from_pretrained_maps,
        refuse("mymaps", "config.json"),
    ),
    Case(
        "m3-apply-lola-cache-folder-as-maps",
        "messages",
        "apply_lola(model, config, feature_maps=c) where c holds a saved LoLACache",
        _apply_cache_folder_as_maps,
        refuse("lola_config.json|feature_maps.safetensors"),
    ),
]

CASES = [*in_batch(1, BATCH_1), *in_batch(2, BATCH_2), *in_batch(3, BATCH_3)]
