"""Adversarial cases of class ``messages``: unclear messages.

Batch 1. Bad inputs whose refusal is expected anyway; the question is the message: one line on the
command line, naming the option, model_arg or file at fault (``--needle``, ``--budgets``,
``model_args budgets``), never a bare ``KeyError`` text or a traceback.

Batch 2. Refusals expected anyway; the question is the message: one line on the command line,
naming the option, model_arg, file or plug-in at fault. Format specs and conversions in templates
(past the placeholder check), a config file too deeply nested for the JSON parser, values of the
wrong type inside a config file (a variant's budgets, lm-eval's lola_config), a model folder
without a tokenizer, and plug-ins whose failure or size surfaces inside lola.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...common import write_random_maps
from ..builders import (
    EXPORT,
    LOLA,
    NIAH,
    PPL,
    budgets_file,
    cli_q,
    hay,
    hf_folder,
    layer_and_state,
    lm_eval_model,
    niah,
    niah_config,
    perplexity,
    policy,
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

CASES = [*in_batch(1, BATCH_1), *in_batch(2, BATCH_2)]
