"""Batch 2, class 7: unclear messages.

Refusals expected anyway; the question is the message: one line on the command line, naming the
option, model_arg, file or plug-in at fault. Format specs and conversions in templates (past the
placeholder check), a config file too deeply nested for the JSON parser, values of the wrong
type inside a config file (a variant's budgets, lm-eval's lola_config), a model folder without
a tokenizer, and plug-ins whose failure or size surfaces inside lola.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from common import EXPORT, NIAH, PPL, hay, lm_eval_model, niah, tiny
from common2 import cli_q, hf_folder
from harness import Case, Ctx, cli, export, refuse

QUESTION = ["--question", "What is the code of {key}?"]
LOLA = [*NIAH[:-1], "lola", "--window", "8", "--sparse-size", "8"]


def _needle(needle: str, *extra: str):
    return lambda ctx: niah(ctx, "r", "--needle", needle, *QUESTION, *extra)


def _lm_config(text: str, name: str = "c.yaml"):
    def run(ctx: Ctx):
        from lola.integrations.lm_eval.model import LoLALM

        return LoLALM(pretrained="tiny-random-llama", device="cpu", lola_config=str(ctx.write(name, text)))

    return run


def _schedule_plugin(until, period: int = 4):
    """lola niah --methods lola with a variant whose schedule is a plug-in (period ``period``)
    answering ``until(seen)``."""

    def run(ctx: Ctx):
        from lola.schedules import register, unregister

        @dataclass(frozen=True)
        class Plugin:
            period: int

            def tokens_until_step(self, seen):
                return until(seen)

        register("odd_schedule", lambda chunk: Plugin(period), overwrite=True)
        try:
            config = ctx.write("opts.yaml", "variants:\n  s:\n    schedule: odd_schedule\n")
            return cli([*LOLA, "--config", str(config), "--out", str(ctx.path("r"))])
        finally:
            unregister("odd_schedule")

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
    from common import write_maps

    write_maps(ctx.path("maps"))
    folder = hf_folder(ctx.path("m"), "llama", num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    return cli_q(
        [
            "perplexity",
            "--model",
            str(folder),
            "--feature-maps",
            str(ctx.path("maps")),
            "--lengths",
            "64",
            "--windows",
            "1",
            "--generate",
            "0",
            "--methods",
            "lolcats",
            "--text",
            str(hay(ctx)),
        ]
    )


def _cache_load_other_dtype(ctx: Ctx):
    """A cache saved by the float32 model, loaded after model.to(bfloat16)."""
    from common import saved_cache

    from lola.integrations.transformers import LoLACache

    model, _ = saved_cache(ctx.path("c"))
    model.to(torch.bfloat16)
    return LoLACache.load(ctx.path("c"), model)


def _apply_config_dict(ctx: Ctx):
    from lola.integrations.transformers import apply_lola

    model, _ = tiny()
    return apply_lola(model, {"window": 8})


CASES = [
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
        lambda ctx: niah(ctx, "r", "--config", str(ctx.write("deep.json", '{"variants": ' + "[" * 100_000 + "]" * 100_000 + "}"))),
        refuse("--config|deep.json"),
    ),
    Case(
        "m2-config-variant-budgets-a-number",
        "messages",
        "lola niah --methods lola --config with a variant whose budgets is 5",
        lambda ctx: cli([*LOLA, "--config", str(ctx.write("opts.yaml", "variants:\n  a:\n    budgets: 5\n")), "--out", str(ctx.path("r"))]),
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
