"""Class 6: inputs that should be refused (nothing cast, guessed or dropped).

Text files that are not text (or are empty), lengths beyond the model's positions, unknown
names, entries given twice (duplicate keys in JSON or YAML, a text source listed twice), typos
in lm-eval model_args, and format-string tricks in the needle templates.
"""

from __future__ import annotations

import torch
from common import EXPORT, NIAH, PPL, PROSE, hay, lm_eval_model, niah, patched, rehash_maps, tiny, write_maps
from harness import Case, CaseFailure, Ctx, accept, cli, ensure, export, refuse

import lola


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


def _niah_config(name: str, text: str):
    return lambda ctx: niah(ctx, "r", "--config", str(ctx.write(name, text)))


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

    folder = write_maps(ctx.path("m"))
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

CASES = [
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
    Case("ref-niah-unknown-method", "refused", "lola niah --methods fulll", lambda ctx: niah(ctx, "r", "--methods", "fulll"), refuse("fulll")),
    Case("ref-niah-unknown-model", "refused", "lola niah --model nosuch-model", lambda ctx: niah(ctx, "r", "--model", "nosuch-model"), refuse("nosuch-model")),
    Case("ref-niah-lengths-negative", "refused", "lola niah --lengths -400", lambda ctx: niah(ctx, "r", "--lengths", "-400"), refuse("--lengths")),
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
        lambda ctx: cli([*NIAH[:-1], "lola", "--config", str(ctx.write("opts.yaml", "variants:\n  a:\n    policy: nosuch\n")), "--out", str(ctx.path("r"))]),
        refuse("nosuch"),
    ),
    Case(
        "ref-niah-variants-without-lola",
        "refused",
        "lola niah --methods window --config with a variant (policy 'nosuch'): variants only run with lola",
        _niah_config("opts.yaml", "variants:\n  a:\n    policy: nosuch\n"),
        refuse("variants", check=_described("the variants were dropped without a word (and never validated)")),
    ),
    Case(
        "ref-niah-config-duplicate-key-yaml",
        "refused",
        "lola niah --config opts.yaml with window: 8 and window: 16",
        _niah_config("opts.yaml", "window: 8\nwindow: 16\n"),
        refuse("window", check=_described("one of the two values was kept silently")),
    ),
    Case(
        "ref-niah-config-duplicate-key-json",
        "refused",
        'lola niah --config opts.json with {"window": 8, "window": 16}',
        _niah_config("opts.json", '{"window": 8, "window": 16}'),
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
