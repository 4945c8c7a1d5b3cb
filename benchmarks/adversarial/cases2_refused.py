"""Batch 2, class 6: inputs that should be refused (nothing cast, guessed or dropped).

One text given twice under two names (a hard link), keys given twice in JSON that lola reads
back other than through ``read_json`` (a feature-map description, ``cache.json``), a truthy
string for ``force``, a YAML alias bomb and Python tags in ``--config``, a haystack whose only
sentence is longer than the context (silently dropped), duplicates in the lists of other
commands, and names one letter-case away from a valid one.
"""

from __future__ import annotations

import json
import os

from common import EXPORT, LINEARIZE, NIAH, PPL, PROSE, niah, saved_cache, tiny, tiny_model, write_maps
from common2 import status
from harness import Case, CaseFailure, Ctx, cli, either, ensure, export, refuse

import lola


def _described(what: str):
    def check(result, ctx):
        raise CaseFailure(what)

    return check


def _hard_link_pair(ctx: Ctx):
    a = ctx.write("a.txt", PROSE * 2)
    os.link(a, ctx.path("link.txt"))
    return str(a), str(ctx.path("link.txt"))


def _duplicate_maps_description(ctx: Ctx):
    """A feature-map folder whose lola_config.json gives "lola_config" twice (mixing lola_authors,
    then the real entry); applied to the tiny model."""
    from lola.integrations.transformers import apply_lola

    folder = write_maps(ctx.path("m"))
    path = folder / "lola_config.json"
    meta = json.loads(path.read_text())
    other = json.dumps({**meta["lola_config"], "mixing": "lola_authors"})
    path.write_text(path.read_text().replace("{", '{"lola_config": ' + other + ",", 1))
    model, _ = tiny()
    apply_lola(model, lola.LoLAConfig(sparse_size=0), feature_maps=folder)
    return model._lola.config.mixing


def _duplicate_cache_key(ctx: Ctx):
    """cache.json with "cumulative_lengths" given twice ([1, 1] first, the saved lengths last)."""
    from lola.integrations.transformers import LoLACache

    model, _ = saved_cache(ctx.path("c"))
    path = ctx.path("c/cache.json")
    path.write_text(path.read_text().replace("{", '{"cumulative_lengths": [1, 1],', 1))
    return LoLACache.load(ctx.path("c"), model).get_seq_length()


def _force_string(ctx: Ctx):
    from lola.integrations.transformers import apply_lola

    model = tiny_model("mistral", sliding_window=16, max_position_embeddings=256)
    return apply_lola(model, lola.LoLAConfig(), force="false")


def _alias_bomb(ctx: Ctx):
    """--config whose variant's policy option is a YAML alias bomb: 10**8 leaves from 90 lines."""
    levels = ["&a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"] + [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    text = "variants:\n  v:\n    policy: sre\n    policy_kwargs:\n      eps: [" + ", ".join(levels) + "]\n"
    return cli([*NIAH[:-1], "lola", "--config", str(ctx.write("opts.yaml", text)), "--out", str(ctx.path("r"))])


def _long_sentence(ctx: Ctx):
    """A haystack whose one sentence (20,000 words) is longer than the 400-token context."""
    path = ctx.write("hay.txt", "The " + "long " * 20000 + "end.")
    return niah(ctx, "r", "--haystack-file", str(path))


def _some_haystack(result, ctx):
    rec = json.loads(ctx.path("r/samples.jsonl").read_text().splitlines()[0])
    ensure(rec["prompt_tokens"] > 0, "no prompt")
    raise CaseFailure(f"accepted: the prompts hold no haystack text at all ({rec['prompt_tokens']} tokens of template and needle); the haystack was dropped")


def _lm_config(text: str):
    def run(ctx: Ctx):
        from lola.integrations.lm_eval.model import LoLALM

        return LoLALM(pretrained="tiny-random-llama", device="cpu", lola_config=str(ctx.write("c.yaml", text)))

    return run


CASES = [
    Case(
        "x2-perplexity-text-hard-linked-twice",
        "refused",
        "lola perplexity --text a.txt link.txt where link.txt is a hard link of a.txt (one text, two names)",
        lambda ctx: cli([*PPL, "--text", *_hard_link_pair(ctx)]),
        refuse("link.txt|a.txt", check=_described("accepted one file given twice (one half trains, the other is held out)")),
    ),
    Case(
        "x2-linearize-text-hard-linked-twice",
        "refused",
        "lola linearize --text a.txt link.txt where link.txt is a hard link of a.txt",
        lambda ctx: cli([*LINEARIZE, "--text", *_hard_link_pair(ctx), "--out", str(ctx.path("lin"))]),
        refuse("link.txt|a.txt", check=_described("accepted one file given twice (trained on, then held out)")),
    ),
    Case(
        "x2-maps-description-key-twice",
        "refused",
        'a feature-map lola_config.json giving "lola_config" twice (mixing lola_authors first)',
        _duplicate_maps_description,
        refuse("lola_config.json", check=_described("one of the two entries was kept silently")),
    ),
    Case(
        "x2-cache-json-key-twice",
        "refused",
        'a saved cache.json giving "cumulative_lengths" twice ([1, 1] first)',
        _duplicate_cache_key,
        refuse("cache.json", check=_described("one of the two entries was kept silently")),
    ),
    Case(
        "x2-apply-lola-force-string-false",
        "refused",
        "apply_lola(Mistral with a binding window, force='false') (a truthy string)",
        _force_string,
        refuse("force", check=_described("the string 'false' was taken as force=True: the architecture check was skipped")),
    ),
    Case(
        "x2-niah-config-yaml-alias-bomb",
        "refused",
        "lola niah --config: a 2 KB YAML whose aliases expand to 10**8 values (a variant's eps)",
        _alias_bomb,
        refuse("eps|--config|opts.yaml"),
        timeout=40,
    ),
    Case(
        "x2-niah-config-python-tag",
        "refused",
        "lola niah --config with a !!python/object/apply tag",
        lambda ctx: niah(ctx, "r", "--config", str(ctx.write("opts.yaml", "seed: !!python/object/apply:os.getpid []\n"))),
        refuse("opts.yaml"),
    ),
    Case(
        "x2-niah-config-non-string-key",
        "refused",
        "lola niah --config opts.yaml whose key is the int 1",
        lambda ctx: niah(ctx, "r", "--config", str(ctx.write("opts.yaml", "1: 2\n"))),
        refuse("opts.yaml"),
    ),
    Case(
        "x2-niah-haystack-one-sentence-too-long",
        "refused",
        "lola niah --haystack-file whose only sentence (20,000 words) is longer than the 400-token context",
        _long_sentence,
        refuse("--haystack-file|hay.txt", check=_some_haystack),
    ),
    Case(
        "x2-perplexity-methods-twice",
        "refused",
        "lola perplexity --methods full full",
        lambda ctx: cli([*PPL[:-2], "--methods", "full", "full", "--text", str(ctx.write("t.txt", PROSE))]),
        refuse("methods"),
    ),
    Case(
        "x2-export-lengths-twice",
        "refused",
        "export-niah --lengths 512 512",
        lambda ctx: export(["--out", str(ctx.path("tasks")), *EXPORT[:2], "--lengths", "512", "512", "--samples", "1"]),
        refuse("lengths"),
    ),
    Case(
        "x2-niah-budgets-capitalised-uniform",
        "refused",
        "lola niah --methods lola --budgets Uniform (not the keyword uniform)",
        lambda ctx: cli([*NIAH[:-1], "lola", "--budgets", "Uniform", "--out", str(ctx.path("r"))]),
        refuse("Uniform"),
    ),
    Case(
        "x2-niah-task-capitalised",
        "refused",
        "lola niah --task NIAH_SINGLE_1",
        lambda ctx: niah(ctx, "r", "--task", "NIAH_SINGLE_1"),
        refuse("NIAH_SINGLE_1"),
    ),
    Case(
        "x2-niah-methods-empty-name",
        "refused",
        "lola niah --methods '' window",
        lambda ctx: cli([*NIAH[:-1], "", "window", "--out", str(ctx.path("r"))]),
        refuse("methods"),
    ),
    Case(
        "x2-lm-eval-lola-config-holds-variants",
        "refused",
        "lm-eval LoLALM(lola_config=c.yaml) where the file holds lola niah's `variants`",
        _lm_config("variants:\n  a: {window: 8}\n"),
        refuse("variants"),
    ),
    Case(
        "x2-niah-feature-maps-empty-folder",
        "refused",
        "lola niah --feature-maps an empty folder",
        lambda ctx: (ctx.path("m").mkdir(), niah(ctx, "r", "--feature-maps", str(ctx.path("m"))))[1],
        refuse("m"),
    ),
    Case(
        "x2-niah-haystack-only-zero-width-spaces",
        "refused",
        "lola niah --haystack-file holding only zero-width spaces (U+200B): no visible text",
        lambda ctx: niah(ctx, "r", "--haystack-file", str(ctx.write("hay.txt", "\u200b" * 3000))),
        either("hay.txt", check=status(0)),
    ),
]
