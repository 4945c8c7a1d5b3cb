"""Adversarial cases of class ``refused``: inputs that should be refused (nothing cast, guessed or
dropped).

Batch 1. Text files that are not text (or are empty), lengths beyond the model's positions,
unknown names, entries given twice (duplicate keys in JSON or YAML, a text source listed twice),
typos in lm-eval model_args, and format-string tricks in the needle templates.

Batch 2. One text given twice under two names (a hard link), keys given twice in JSON that lola
reads back other than through ``read_json`` (a feature-map description, ``cache.json``), a truthy
string for ``force``, a YAML alias bomb and Python tags in ``--config``, a haystack whose only
sentence is longer than the context (silently dropped), duplicates in the lists of other commands,
and names one letter-case away from a valid one.

Batch 3. Options that would do nothing, given with methods, stages, targets or rules they do not
affect: position limits with full attention or without bounded positions, budgets and policies
without a sparse cache, the mixing rule of the window method, fold options without a fold, a share
cap without a share, feature sizes of a map that has none, ``--from-lora`` with nothing to continue
from, layers a model does not have; and one budget given twice under two spellings.
"""

from __future__ import annotations

import json
import os

import torch

import lola

from ...common import rehash_maps, tiny_model, write_random_maps
from ..builders import (
    EXPORT,
    LINEARIZE,
    LOLA,
    NIAH,
    NIAH_LOLA,
    PPL,
    PPL_NO_LOLA,
    PROSE,
    SWEEP,
    budgets_file,
    described,
    fit,
    hay,
    lm_eval_model,
    maps_folder,
    niah,
    niah_config,
    niah_option,
    patched,
    ppl,
    probe,
    saved_cache,
    status,
    tiny,
)
from ..harness import Case, CaseFailure, Ctx, accept, cli, either, ensure, export, in_batch, refuse


def _status_0(result, ctx):
    ensure(result.status == 0, f"exit {result.status}")


def _haystack(data: bytes):
    def run(ctx: Ctx):
        return niah(ctx, "r", "--haystack-file", str(ctx.write("hay.txt", data)))

    return run


def _ppl_text(*names_and_data):
    """``lola perplexity --text`` with the given files (``(name, bytes or None)``; None: already written)."""

    def run(ctx: Ctx):
        paths = []
        for name, data in names_and_data:
            if data is not None:
                ctx.write(name, data)
            paths.append(str(ctx.path(name)))
        return cli([*PPL, "--text", *paths])

    return run


def _lm(**kwargs):
    def run(ctx: Ctx):
        from lola.integrations.lm_eval.model import LoLALM

        files = {k: v for k, v in kwargs.items() if isinstance(v, bytes)}
        for name, data in files.items():
            kwargs[name] = str(ctx.write(name.replace("__", "."), data))
        return LoLALM(pretrained="tiny-random-llama", device="cpu", **{k.split("__")[0]: v for k, v in kwargs.items()})

    return run


def _lm_args(args: str):
    def run(ctx: Ctx):
        return lm_eval_model(args)

    return run


def _duplicate_budget_keys(ctx: Ctx):
    from lola import budgets

    text = '{"sparse_size_per_head": [[8, 8], [8, 8]], "uniform_sparse_size": 8, "scores": [[1, 1], [1, 1]], "power": 0.5, "power": 2.0}'
    return budgets.load(ctx.write("b.json", text)).power


def _float64_maps(ctx: Ctx):
    """A feature-map folder whose tensors are float64 (sums recomputed): read as the same maps."""
    from safetensors.torch import load_file, save_file

    from lola.integrations.transformers import apply_lola

    folder = write_random_maps(ctx.path("m"))
    tensors = load_file(folder / "feature_maps.safetensors")
    save_file({k: v.double() for k, v in tensors.items()}, folder / "feature_maps.safetensors")
    rehash_maps(folder)
    model, _ = tiny()
    apply_lola(model, lola.LoLAConfig(sparse_size=0), feature_maps=folder)
    got = model.model.layers[0].self_attn.lola.feature_map_q.mlp.layer.detach()
    return got, tensors["model.layers.0.self_attn.feature_map_q.mlp.layer"]


def _same_maps(pair, ctx):
    got, want = pair
    ensure(torch.equal(got.float(), want.float()), "the float64 maps were read as other values")


def _chunk_beyond_positions(ctx: Ctx):
    from lola.models import tiny_random

    def small(name, **kwargs):  # the tiny model with 512 positions: a long chunk stays cheap
        model, tok = tiny_random()
        model.config.max_position_embeddings = 512
        return model, tok

    with patched("lola.models", "load", small):
        return cli(
            [
                "linearize",
                "--quick",
                "--stage",
                "1",
                "--steps",
                "1",
                "--train-chunks",
                "1",
                "--chunk-tokens",
                "600",
                "--text",
                str(hay(ctx, text=PROSE * 3)),
                "--out",
                str(ctx.path("lin")),
            ]
        )


def _described(what: str):
    def check(result, ctx):
        raise CaseFailure(what)

    return check


BAD_BYTES = (PROSE * 4).encode()
BAD_BYTES = b"".join(BAD_BYTES[i : i + 300] + b"\xff" for i in range(0, len(BAD_BYTES), 300))  # ~0.3% undecodable


def _hard_link_pair(ctx: Ctx):
    a = ctx.write("a.txt", PROSE * 2)
    os.link(a, ctx.path("link.txt"))
    return str(a), str(ctx.path("link.txt"))


def _duplicate_maps_description(ctx: Ctx):
    """A feature-map folder whose lola_config.json gives "lola_config" twice (mixing lola_authors,
    then the real entry); applied to the tiny model."""
    from lola.integrations.transformers import apply_lola

    folder = write_random_maps(ctx.path("m"))
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
    return niah_config(text, argv=NIAH_LOLA)(ctx)


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


# -- batch 1: written before the fixes it led to ----------------------------------------------------

BATCH_1 = [
    Case("ref-haystack-empty-file", "refused", "lola niah --haystack-file with an empty file", _haystack(b""), refuse("hay.txt")),
    Case(
        "ref-haystack-nul-after-64k",
        "refused",
        "lola niah --haystack-file: 90 KB of prose, then NUL bytes",
        _haystack((PROSE * 20).encode() + b"\x00\x00\x00 binary tail \x00" * 50),
        refuse("hay.txt"),
    ),
    Case(
        "ref-haystack-few-bad-bytes",
        "refused",
        "lola niah --haystack-file with 0.3% undecodable bytes (under the documented 1% tolerance)",
        _haystack(BAD_BYTES),
        accept(_status_0),
    ),
    Case(
        "ref-haystack-utf8-bom",
        "refused",
        "lola niah --haystack-file starting with a UTF-8 BOM",
        _haystack(b"\xef\xbb\xbf" + PROSE.encode()),
        accept(_status_0),
    ),
    Case("ref-perplexity-text-empty", "refused", "lola perplexity --text empty.txt (0 bytes)", _ppl_text(("empty.txt", b"")), refuse("empty.txt")),
    Case(
        "ref-perplexity-text-twice",
        "refused",
        "lola perplexity --text a.txt a.txt (the held-out part is then the training part too)",
        _ppl_text(("a.txt", PROSE.encode()), ("a.txt", None)),
        refuse("a.txt", check=_described("accepted a source listed twice")),
    ),
    Case(
        "ref-perplexity-length-beyond-positions",
        "refused",
        "lola perplexity --lengths 9000 on the tiny model (8192 positions)",
        lambda ctx: cli([*PPL, "--text", str(hay(ctx)), "--lengths", "9000"]),
        refuse("9000"),
    ),
    Case(
        "ref-linearize-chunk-beyond-positions",
        "refused",
        "lola linearize --chunk-tokens 600 on a model of 512 positions",
        _chunk_beyond_positions,
        refuse("--chunk-tokens", check=_described("trained on chunks longer than the model's positions")),
    ),
    Case(
        "ref-export-length-beyond-positions",
        "refused",
        "export-niah --model tiny-random-llama --lengths 9000 (8192 positions)",
        lambda ctx: export(["--out", str(ctx.path("tasks")), "--model", "tiny-random-llama", "--lengths", "9000", "--samples", "1"]),
        refuse("9000", check=_described("exported prompts longer than the model can hold")),
    ),
    niah_option("ref-niah-unknown-method", "refused", "--methods", "fulll", refuse("fulll")),
    niah_option("ref-niah-unknown-model", "refused", "--model", "nosuch-model", refuse("nosuch-model")),
    niah_option("ref-niah-lengths-negative", "refused", "--lengths", "-400", refuse("--lengths")),
    Case(
        "ref-perplexity-text-unknown-corpus",
        "refused",
        "lola perplexity --text nosuchcorpus",
        lambda ctx: cli([*PPL, "--text", "nosuchcorpus"]),
        refuse("nosuchcorpus"),
    ),
    Case(
        "ref-niah-variant-unknown-policy",
        "refused",
        "lola niah --methods lola --config with a variant whose policy is 'nosuch'",
        niah_config("variants:\n  a:\n    policy: nosuch\n", argv=NIAH_LOLA),
        refuse("nosuch"),
    ),
    Case(
        "ref-niah-variants-without-lola",
        "refused",
        "lola niah --methods window --config with a variant (policy 'nosuch'): variants only run with lola",
        niah_config("variants:\n  a:\n    policy: nosuch\n"),
        refuse("variants", check=_described("the variants were dropped without a word (and never validated)")),
    ),
    Case(
        "ref-niah-config-duplicate-key-yaml",
        "refused",
        "lola niah --config opts.yaml with window: 8 and window: 16",
        niah_config("window: 8\nwindow: 16\n"),
        refuse("window", check=_described("one of the two values was kept silently")),
    ),
    Case(
        "ref-niah-config-duplicate-key-json",
        "refused",
        'lola niah --config opts.json with {"window": 8, "window": 16}',
        niah_config('{"window": 8, "window": 16}', "opts.json"),
        refuse("window", check=_described("one of the two values was kept silently")),
    ),
    Case(
        "ref-budgets-duplicate-key",
        "refused",
        'a budgets file with "power" given twice (0.5 and 2.0)',
        _duplicate_budget_keys,
        refuse("power", check=_described("one of the two values was kept silently")),
    ),
    Case(
        "ref-lm-eval-lola-config-bad-yaml",
        "refused",
        "LoLALM(lola_config=bad.yaml) with invalid YAML",
        _lm(lola_config__bad__yaml=b"window: [8\nsinks: 2\n"),
        refuse("bad.yaml"),
    ),
    Case(
        "ref-lm-eval-lola-config-binary",
        "refused",
        "LoLALM(lola_config=c.json) holding binary bytes",
        _lm(lola_config__c__json=b"\xff\xfe\x00\x01"),
        refuse("c.json"),
    ),
    Case(
        "ref-lm-eval-lola-config-unknown-field",
        "refused",
        'LoLALM(lola_config=c.json) holding {"windw": 8}',
        _lm(lola_config__c__json=b'{"windw": 8}'),
        refuse("windw"),
    ),
    Case("ref-lm-eval-arg-case-typo", "refused", "lm-eval model_args Window=8", _lm_args("pretrained=tiny-random-llama,Window=8"), refuse("Window")),
    Case(
        "ref-lm-eval-arg-dash-typo",
        "refused",
        "lm-eval model_args apply-lola=false",
        _lm_args("pretrained=tiny-random-llama,apply-lola=false"),
        refuse("apply-lola"),
    ),
    Case(
        "ref-needle-attribute-access",
        "refused",
        "lola niah --needle '{key.__class__} holds {value}.' (format-string attribute access)",
        lambda ctx: niah(ctx, "r", "--needle", "{key.__class__} holds {value}.", "--question", "What does {key} hold?"),
        refuse("--needle|needle template", check=_described("the needle was built with str(type(key)) in it")),
    ),
    Case(
        "ref-niah-multikey-with-haystack",
        "refused",
        "lola niah --task niah_multikey_2 --haystack-file (single-needle only)",
        lambda ctx: niah(ctx, "r", "--task", "niah_multikey_2", "--haystack-file", str(hay(ctx))),
        refuse("niah_single_1"),
    ),
    Case("ref-maps-float64-tensors", "refused", "feature maps stored as float64 (sums recomputed)", _float64_maps, accept(_same_maps)),
    Case(
        "ref-export-unknown-task",
        "refused",
        "export-niah --task niah_single_9",
        lambda ctx: export(["--out", str(ctx.path("tasks")), *EXPORT, "--task", "niah_single_9"]),
        refuse("niah_single_9"),
    ),
    Case(
        "ref-niah-feature-maps-shipped-name-typo",
        "refused",
        "lola niah --feature-maps smollm2-135m-instruc (one letter short)",
        lambda ctx: cli([*NIAH, "--feature-maps", "smollm2-135m-instruc", "--out", str(ctx.path("r"))]),
        refuse("smollm2-135m-instruc"),
    ),
]

# -- batch 2: written after them, to check that they hold ------------------------------------------

BATCH_2 = [
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
        niah_config("seed: !!python/object/apply:os.getpid []\n"),
        refuse("opts.yaml"),
    ),
    Case(
        "x2-niah-config-non-string-key",
        "refused",
        "lola niah --config opts.yaml whose key is the int 1",
        niah_config("1: 2\n"),
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
        lambda ctx: cli([*NIAH_LOLA, "--budgets", "Uniform", "--out", str(ctx.path("r"))]),
        refuse("Uniform"),
    ),
    Case(
        "x2-niah-task-capitalised", "refused", "lola niah --task NIAH_SINGLE_1", lambda ctx: niah(ctx, "r", "--task", "NIAH_SINGLE_1"), refuse("NIAH_SINGLE_1")
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


# -- batch 3: written before the round-three fixes, to measure them ---------------------------------

FULL = ["--methods", "full"]


def _niah_full(*extra: str):
    """lola niah of full attention alone with ``extra`` options (each of which sets another method only)."""
    return lambda ctx: niah(ctx, "r", *FULL, *extra)


def _niah_with_file(option: str, make, *extra: str):
    """lola niah (:data:`NIAH`, ``extra``) with ``option`` naming what ``make(ctx)`` writes."""
    return lambda ctx: niah(ctx, "r", *extra, option, str(make(ctx)))


def _apply(cfg: lola.LoLAConfig):
    def run(ctx: Ctx):
        from lola.integrations.transformers import apply_lola

        return apply_lola(tiny()[0], cfg)

    return run


def _nothing(what: str):
    return described(what)


BATCH_3 = [
    Case(
        "x3-niah-full-positions-bounded",
        "refused",
        "lola niah --methods full --positions bounded (positions bound every method but full)",
        _niah_full("--positions", "bounded"),
        refuse("--positions"),
    ),
    Case(
        "x3-niah-full-exact-distance",
        "refused",
        "lola niah --methods full --exact-distance 512 (no bounded positions, and full attention has none)",
        _niah_full("--exact-distance", "512"),
        refuse("--exact-distance"),
    ),
    Case(
        "x3-niah-full-window",
        "refused",
        "lola niah --methods full --window 16 (full attention has no window)",
        _niah_full("--window", "16"),
        refuse("--window"),
    ),
    Case("x3-niah-full-sinks", "refused", "lola niah --methods full --sinks 2 (full attention pins nothing)", _niah_full("--sinks", "2"), refuse("--sinks")),
    Case(
        "x3-niah-full-feature-maps",
        "refused",
        "lola niah --methods full --feature-maps FOLDER (maps are loaded into every method but full)",
        _niah_with_file("--feature-maps", maps_folder, *FULL),
        refuse("--feature-maps"),
    ),
    Case(
        "x3-niah-window-budgets-file",
        "refused",
        "lola niah --methods window --budgets b.json (budgets size the lola method's sparse cache)",
        _niah_with_file("--budgets", lambda ctx: budgets_file(ctx.path("b.json"))),
        refuse("--budgets"),
    ),
    Case(
        "x3-niah-window-mixing",
        "refused",
        "lola niah --methods window --mixing lolcats (the window method reads its exact tokens alone)",
        lambda ctx: niah(ctx, "r", "--mixing", "lolcats"),
        refuse("--mixing"),
    ),
    Case(
        "x3-niah-sre-fold-repeats",
        "refused",
        "lola niah --methods lola --policies sre --fold-repeats 0.9 (repeats are folded under the learned policy only)",
        lambda ctx: cli([*LOLA, "--policies", "sre", "--fold-repeats", "0.9", "--out", str(ctx.path("r"))]),
        refuse("--fold-repeats"),
    ),
    Case(
        "x3-niah-fold-copies-with-fold-off",
        "refused",
        "lola niah --methods lola --fold-copies 2 with repeats not folded (no feature maps: --fold-repeats is 0)",
        lambda ctx: cli([*LOLA, "--fold-copies", "2", "--out", str(ctx.path("r"))]),
        refuse("--fold-copies"),
    ),
    Case(
        "x3-niah-share-cap-softmax-only",
        "refused",
        "lola niah --methods lola --linear-share-cap 0.5 with the softmax_only rule (the state has no share of the output)",
        lambda ctx: cli([*LOLA, "--linear-share-cap", "0.5", "--out", str(ctx.path("r"))]),
        refuse("--linear-share-cap"),
    ),
    Case(
        "x3-niah-config-gqa-storage-full-only",
        "refused",
        "lola niah --methods full --config with gqa_storage: query_head (a storage of methods that do not run)",
        niah_config("gqa_storage: query_head\n", argv=[*NIAH[:-2], *FULL]),
        refuse("gqa_storage"),
    ),
    Case(
        "x3-perplexity-policy-without-lola",
        "refused",
        "lola perplexity --methods full hybrid --policy recency (the policy scores the lola method's sparse cache)",
        lambda ctx: ppl(ctx, PPL_NO_LOLA, "--policy", "recency"),
        refuse("--policy"),
    ),
    Case(
        "x3-perplexity-sparse-size-without-lola",
        "refused",
        "lola perplexity --methods full hybrid --sparse-size 32 (the hybrid keeps its window alone here)",
        lambda ctx: ppl(ctx, PPL_NO_LOLA, "--sparse-size", "32"),
        refuse("--sparse-size"),
    ),
    Case(
        "x3-perplexity-budgets-without-lola",
        "refused",
        "lola perplexity --methods full hybrid --budgets auto (budgets size the lola method's sparse cache)",
        lambda ctx: ppl(ctx, PPL_NO_LOLA, "--budgets", "auto"),
        refuse("--budgets"),
    ),
    Case(
        "x3-perplexity-generate-windows-without-generation",
        "refused",
        "lola perplexity --generate 0 --generate-windows 3",
        lambda ctx: ppl(ctx, None, "--generate-windows", "3"),
        refuse("--generate-windows"),
    ),
    Case(
        "x3-perplexity-full-positions-bounded",
        "refused",
        "lola perplexity --methods full --positions bounded",
        lambda ctx: ppl(ctx, None, "--positions", "bounded"),
        refuse("--positions"),
    ),
    Case(
        "x3-perplexity-full-exact-distance",
        "refused",
        "lola perplexity --methods full --exact-distance 512 (no bounded positions)",
        lambda ctx: ppl(ctx, None, "--exact-distance", "512"),
        refuse("--exact-distance"),
    ),
    Case(
        "x3-probe-exact-distance-without-bounded",
        "refused",
        "lola probe --methods hybrid --exact-distance 512 (positions left absolute)",
        lambda ctx: probe(ctx, "p", "--exact-distance", "512"),
        refuse("--exact-distance"),
    ),
    Case(
        "x3-fit-scorer-kvzip-with-future-options",
        "refused",
        "lola fit-scorer --target kvzip --min-distance 8 --min-future 16 (options of the future target)",
        lambda ctx: fit(ctx, "s.safetensors", "--target", "kvzip"),
        refuse("--min-distance|--min-future"),
    ),
    Case(
        "x3-linearize-identity-map-feature-dim",
        "refused",
        "lola linearize --feature-map hedgehog_identity --feature-dim 32 (that map's size is the head's)",
        lambda ctx: cli([*LINEARIZE, "--feature-map", "hedgehog_identity", "--feature-dim", "32", "--out", str(ctx.path("lin"))]),
        refuse("--feature-dim"),
    ),
    Case(
        "x3-linearize-from-lora-without-feature-maps",
        "refused",
        "lola linearize --quick --from-lora (both stages, no --feature-maps to continue from)",
        lambda ctx: cli(["linearize", "--quick", "--from-lora", "--steps", "2", "--train-chunks", "1", "--out", str(ctx.path("lin"))]),
        refuse("--from-lora"),
        timeout=180,
    ),
    Case(
        "x3-config-identity-map-feature-dim",
        "refused",
        "LoLAConfig(feature_map='hedgehog_identity', feature_dim=32)",
        lambda ctx: lola.LoLAConfig(feature_map="hedgehog_identity", feature_dim=32),
        refuse("feature_dim", check=_nothing("feature_dim does nothing with hedgehog_identity")),
    ),
    Case(
        "x3-config-share-cap-softmax-only",
        "refused",
        "apply_lola(LoLAConfig(linear_share_cap=0.5)) without feature maps: the default softmax_only rule reads no state "
        "(first written as the bare LoLAConfig, where the rule is not yet decided: trained maps make an unset rule the paper's)",
        lambda ctx: lola.apply_lola(tiny()[0], lola.LoLAConfig(linear_share_cap=0.5)),
        refuse("linear_share_cap", check=_nothing("the cap does nothing when the state has no share")),
    ),
    Case(
        "x3-config-window-factor-init-softmax-only",
        "refused",
        "LoLAConfig(window_factor_init=0.0) with the softmax_only rule (no window factor is read)",
        lambda ctx: lola.LoLAConfig(window_factor_init=0.0),
        refuse("window_factor_init", check=_nothing("the window factor is never read")),
    ),
    Case(
        "x3-config-chunk-with-tokenwise",
        "refused",
        "LoLAConfig(schedule='tokenwise', chunk=16) (the tokenwise schedule steps every token): accepted by decision "
        "(expectation changed from refuse after the fixes): a config object drawn over a grid carries fields for the points "
        "that use them, as the property tests draw them; the commands refuse the option where a user gives it",
        lambda ctx: lola.LoLAConfig(schedule="tokenwise", chunk=16),
        accept(lambda cfg, ctx: ensure(cfg.schedule == "tokenwise" and cfg.chunk == 16, f"{cfg!r}")),
    ),
    Case(
        "x3-config-policy-options-without-sparse-cache",
        "refused",
        "LoLAConfig(sparse_size=0, policy='random', policy_kwargs={'seed': 3}) (nothing to score): accepted by decision "
        "(expectation changed from refuse after the fixes, as x3-config-chunk-with-tokenwise: a budget grid holds sparse 0)",
        lambda ctx: lola.LoLAConfig(sparse_size=0, policy="random", policy_kwargs={"seed": 3}),
        accept(lambda cfg, ctx: ensure(cfg.sparse_size == 0 and cfg.policy == "random", f"{cfg!r}")),
    ),
    Case(
        "x3-apply-layer-overrides-beyond-model",
        "refused",
        "apply_lola(2-layer model, layer_overrides={5: {'window': 16}})",
        _apply(lola.LoLAConfig(layer_overrides={5: {"window": 16}})),
        refuse("layer_overrides|5"),
    ),
    Case(
        "x3-apply-full-attention-layers-beyond-model",
        "refused",
        "apply_lola(2-layer model, full_attention_layers=[7])",
        _apply(lola.LoLAConfig(full_attention_layers=[7])),
        refuse("full_attention_layers|7"),
    ),
    Case(
        "x3-lm-eval-positions-without-lola",
        "refused",
        "lm-eval model_args apply_lola=false,positions=bounded (the stock model evaluated)",
        lambda ctx: lm_eval_model("pretrained=tiny-random-llama,apply_lola=false,positions=bounded"),
        refuse("positions"),
    ),
    Case(
        "x3-sweep-one-budget-two-spellings",
        "refused",
        "lola sweep --budgets 1/4 2/8 (one budget written twice)",
        lambda ctx: cli([*SWEEP, "--budgets", "1/4", "2/8", "--out", str(ctx.path("s"))]),
        refuse("budgets"),
    ),
]

CASES = [*in_batch(1, BATCH_1), *in_batch(2, BATCH_2), *in_batch(3, BATCH_3)]
