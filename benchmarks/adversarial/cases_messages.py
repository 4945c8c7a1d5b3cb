"""Class 7: unclear messages.

Bad inputs whose refusal is expected anyway; the question is the message: one line on the
command line, naming the option, model_arg or file at fault (``--needle``, ``--budgets``,
``model_args budgets``), never a bare ``KeyError`` text or a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from common import EXPORT, NIAH, PPL, budgets_file, lm_eval_model, niah, policy
from harness import Case, Ctx, cli, export, refuse

QUESTION = ["--question", "What is the code of {key}?"]
LOLA = [*NIAH[:-1], "lola", "--window", "8", "--sparse-size", "8"]


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


CASES = [
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
    Case(
        "msg-needle-lone-brace",
        "messages",
        "lola niah --needle '{key} is {value} {'",
        _needle("{key} is {value} {"),
        refuse("--needle|needle template"),
    ),
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
        lambda ctx: cli(
            [*PPL, "--methods", "lolcats", "--feature-maps", "smollm2-135m-instruct", "--text", str(ctx.write("t.txt", "The sea is wide. " * 300))]
        ),
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
    Case(
        "msg-lm-eval-chunk-zero",
        "messages",
        "lm-eval model_args chunk=0",
        _lm_args("pretrained=tiny-random-llama,chunk=0"),
        refuse("chunk"),
    ),
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
        lambda ctx: cli(
            [
                *LOLA,
                "--config",
                str(ctx.write("opts.yaml", "variants:\n  f:\n    policy: fusion\n    policy_kwargs:\n      policies: [sre, nosuch]\n")),
                "--out",
                str(ctx.path("r")),
            ]
        ),
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
        lambda ctx: niah(ctx, "r", "--config", str(ctx.write("opts.yaml", "variants: [1, 2]\n"))),
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


def _load_list_state():
    from common import layer_and_state

    attn, _, sd = layer_and_state()
    sd["window.k"] = sd["window.k"].tolist()
    state = attn.new_state()
    state.load_state_dict(sd)
    return torch.tensor(0)
