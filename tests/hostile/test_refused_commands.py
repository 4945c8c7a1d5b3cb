"""Hostile inputs, class ``refused``, on the command line: an option given an empty value, a folder,
a file, a link or a missing path where it takes something else, a bad value, or a config file
that is malformed, gives a key twice or expands without bound, is refused in one
``lola CMD: error:`` line naming it, before the model loads, and nothing is written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lola.config import MAX_TOKENS
from tests.hostile.common import (
    FIT_ARGS,
    FIT_TEXT,
    FULL_NIAH,
    GOOD_BUDGETS,
    OTHER_TEXT,
    WINDOW_NIAH,
    Command,
    cut,
    dangling_link,
    fit_checkpoint,
    garbled_journal,
    interrupted_fit,
    make_file,
    make_folder,
    params,
    refused,
    snapshot,
    write_random_maps,
)

transformers = pytest.importorskip("transformers")


# -- empty values, folders, files and links where something else is expected, on every command -----


TINY = ["--model", "tiny-random-llama"]
NIAH = [*WINDOW_NIAH, "--max-new-tokens", "1"]
PROBE = ["probe", *TINY, "--lengths", "400", "--samples", "1", "--methods", "lola", "--max-new-tokens", "1"]
SWEEP = ["sweep", *TINY, "--feature-maps", "none", "--lengths", "600", "--budgets", "1/4", "--haystacks", "noise", "--samples", "1"]
PPL = ["perplexity", *TINY, "--lengths", "64", "--windows", "1", "--generate", "0", "--methods", "full"]
CAL = ["calibrate", *TINY, "--length", "400", "--prompts", "1"]
FIT = ["fit-scorer", *TINY, *FIT_ARGS]
EXPORT = ["export", *TINY]
LIN = ["linearize", "--quick", "--stage", "1"]


def _fit_text(tmp_path):
    return ["--text", make_file(tmp_path, "t.txt", FIT_TEXT)]


def _fit_partial(tmp_path, rewrite=False, damage=None):
    """``--text TEXT --out OUT`` of a fit that stopped after one chunk (FIT's options), its text
    then rewritten or its checkpoint damaged."""
    out, spec = interrupted_fit(tmp_path)
    if rewrite:
        (tmp_path / "text.txt").write_text(OTHER_TEXT)
    if damage is not None:
        damage(fit_checkpoint(out))
    return ["--text", spec.text[0], "--out", str(out)]


COMMANDS = [
    # -- lola niah
    Command("niah --out empty", lambda t: [*NIAH, "--out", ""], ("--out",)),
    Command("niah --haystack-file empty", lambda t: [*NIAH, "--out", str(t / "r"), "--haystack-file", ""], ("--haystack-file",)),
    Command("niah --haystack-file missing", lambda t: [*NIAH, "--out", str(t / "r"), "--haystack-file", str(t / "no.txt")], ("no.txt",)),
    Command("niah --haystack-file of no bytes", lambda t: [*NIAH, "--out", str(t / "r"), "--haystack-file", make_file(t, "h.txt")], ("h.txt",)),
    Command("niah --haystack-file a dangling link", lambda t: [*NIAH, "--out", str(t / "r"), "--haystack-file", dangling_link(t, "h.txt")], ("h.txt",)),
    Command("niah --feature-maps empty", lambda t: [*NIAH, "--out", str(t / "r"), "--feature-maps", ""], ("--feature-maps",)),
    Command("niah --feature-maps a file", lambda t: [*NIAH, "--out", str(t / "r"), "--feature-maps", make_file(t, "m.bin", b"x")], ("m.bin",)),
    Command(
        "niah --feature-maps an empty folder", lambda t: [*NIAH, "--out", str(t / "r"), "--feature-maps", make_folder(t, "m")], ("is not a feature-map folder",)
    ),
    Command("niah --budgets empty", lambda t: [*NIAH, "--out", str(t / "r"), "--methods", "lola", "--budgets", ""], ("--budgets",)),
    Command("niah --budgets a folder", lambda t: [*NIAH, "--out", str(t / "r"), "--methods", "lola", "--budgets", make_folder(t, "b")], ("b is a folder",)),
    Command("niah --budgets of no bytes", lambda t: [*NIAH, "--out", str(t / "r"), "--methods", "lola", "--budgets", make_file(t, "b.json")], ("b.json",)),
    Command("niah --config empty", lambda t: [*NIAH, "--out", str(t / "r"), "--config", ""], ("--config",)),
    Command("niah --config of no bytes (JSON)", lambda t: [*NIAH, "--out", str(t / "r"), "--config", make_file(t, "c.json")], ("c.json",)),
    Command("niah --config of no bytes (YAML)", lambda t: [*NIAH, "--out", str(t / "r"), "--config", make_file(t, "c.yaml")], ("c.yaml", "mapping")),
    Command("niah --config a dangling link", lambda t: [*NIAH, "--out", str(t / "r"), "--config", dangling_link(t, "c.json")], ("c.json",)),
    Command("niah --model empty", lambda t: [*NIAH, "--out", str(t / "r"), "--model", ""], ("--model",)),
    Command("niah --task empty", lambda t: [*NIAH, "--out", str(t / "r"), "--task", ""], ("--task",)),
    Command("niah --methods empty", lambda t: [*NIAH, "--out", str(t / "r"), "--methods", ""], ("--methods",)),
    Command("niah --policies empty", lambda t: [*NIAH, "--out", str(t / "r"), "--methods", "lola", "--policies", ""], ("--policies",)),
    Command("niah --needle empty", lambda t: [*NIAH, "--out", str(t / "r"), "--needle", ""], ("needle",)),
    Command("niah --out holding a garbled journal", lambda t: [*NIAH, "--out", garbled_journal(t)], (".lola-pending.json",)),
    # -- lola probe
    Command("probe --out empty", lambda t: [*PROBE, "--out", ""], ("--out",)),
    Command("probe --out a file", lambda t: [*PROBE, "--out", make_file(t, "p", "mine")], ("--out",)),
    Command("probe --feature-maps a file", lambda t: [*PROBE, "--out", str(t / "p"), "--feature-maps", make_file(t, "m.bin", b"x")], ("m.bin",)),
    # -- lola sweep
    Command("sweep --out empty", lambda t: [*SWEEP, "--out", ""], ("--out",)),
    Command("sweep --out a file", lambda t: [*SWEEP, "--out", make_file(t, "w", "mine")], ("--out",)),
    Command("sweep --batch-size 0", lambda t: [*SWEEP, "--out", str(t / "w"), "--batch-size", "0"], ("--batch-size",)),
    Command(
        "sweep --budgets empty", lambda t: [*SWEEP[:-8], "--lengths", "600", "--budgets", "", "--haystacks", "noise", "--out", str(t / "w")], ("--budgets",)
    ),
    Command("sweep --haystacks empty", lambda t: [*SWEEP[:-4], "--haystacks", "", "--samples", "1", "--out", str(t / "w")], ("--haystacks",)),
    # -- lola perplexity
    Command("perplexity --out empty", lambda t: [*PPL, "--out", ""], ("--out",)),
    Command("perplexity --out under a file", lambda t: [*PPL, "--out", make_file(t, "f", "mine") + "/p.json"], ("--out",)),
    Command("perplexity --text empty", lambda t: [*PPL, "--text", ""], ("--text", "empty")),
    Command("perplexity --text a folder without text", lambda t: [*PPL, "--text", make_folder(t, "texts")], ("texts",)),
    Command("perplexity --text of no bytes", lambda t: [*PPL, "--text", make_file(t, "e.txt")], ("e.txt",)),
    Command("perplexity --feature-maps a file", lambda t: [*PPL, "--feature-maps", make_file(t, "m.bin", b"x")], ("m.bin",)),
    Command("perplexity --out beside a garbled journal", lambda t: [*PPL, "--out", garbled_journal(t) + "/p.json"], (".lola-pending.json",)),
    # -- lola calibrate
    Command("calibrate --out empty", lambda t: [*CAL, "--out", ""], ("--out", "empty")),
    Command("calibrate --out a dangling link", lambda t: [*CAL, "--out", dangling_link(t, "b.json")], ("--out", "symbolic link")),
    Command("calibrate --out a cut budgets file", lambda t: [*CAL, "--out", make_file(t, "b.json", json.dumps(GOOD_BUDGETS)[:30])], ("b.json",)),
    Command("calibrate --out beside a garbled journal", lambda t: [*CAL, "--out", garbled_journal(t) + "/b.json"], (".lola-pending.json",)),
    Command("calibrate --length 1", lambda t: [*CAL, "--out", str(t / "b.json"), "--length", "1"], ("length",), before_load=False),
    Command("calibrate --floor above --sparse-size", lambda t: [*CAL, "--out", str(t / "b.json"), "--sparse-size", "4", "--floor", "5"], ("--floor",)),
    Command("calibrate --seed empty", lambda t: [*CAL, "--out", str(t / "b.json"), "--seed", ""], ("--seed",)),
    # -- lola fit-scorer
    Command("fit-scorer --out empty", lambda t: [*FIT, *_fit_text(t), "--out", ""], ("--out", "empty")),
    Command("fit-scorer --out a folder", lambda t: [*FIT, *_fit_text(t), "--out", make_folder(t, "s")], ("--out", "folder")),
    Command("fit-scorer --out a dangling link", lambda t: [*FIT, *_fit_text(t), "--out", dangling_link(t, "s.safetensors")], ("symbolic link",)),
    Command(
        "fit-scorer --out beside a garbled journal", lambda t: [*FIT, *_fit_text(t), "--out", garbled_journal(t) + "/s.safetensors"], (".lola-pending.json",)
    ),
    Command("fit-scorer --text empty", lambda t: [*FIT, "--text", "", "--out", str(t / "s.safetensors")], ("--text", "empty")),
    Command("fit-scorer --text of no bytes", lambda t: [*FIT, "--text", make_file(t, "e.txt"), "--out", str(t / "s.safetensors")], ("e.txt",)),
    Command("fit-scorer --text a folder without text", lambda t: [*FIT, "--text", make_folder(t, "texts"), "--out", str(t / "s.safetensors")], ("texts",)),
    Command("fit-scorer --text binary", lambda t: [*FIT, "--text", make_file(t, "b.txt", b"\x00\x01" * 500), "--out", str(t / "s.safetensors")], ("b.txt",)),
    Command(
        "fit-scorer --text too short",
        lambda t: [*FIT, "--text", make_file(t, "s.txt", "few words"), "--out", str(t / "s.safetensors")],
        ("--text",),
        before_load=False,
    ),
    Command(
        "fit-scorer --feature-maps empty", lambda t: [*FIT, *_fit_text(t), "--out", str(t / "s.safetensors"), "--feature-maps", ""], ("--feature-maps", "empty")
    ),
    Command(
        "fit-scorer --feature-maps a file",
        lambda t: [*FIT, *_fit_text(t), "--out", str(t / "s.safetensors"), "--feature-maps", make_file(t, "m", b"x")],
        ("--feature-maps",),
    ),
    Command("fit-scorer resume with --documents raised", lambda t: [*FIT, *_fit_partial(t), "--documents", "3"], ("--documents: saved 2, now 3",)),
    Command("fit-scorer resume on a rewritten text", lambda t: [*FIT, *_fit_partial(t, rewrite=True)], ("--text", "changed")),
    Command("fit-scorer resume on a cut checkpoint", lambda t: [*FIT, *_fit_partial(t, damage=cut)], ("s.safetensors.partial", "not a readable")),
    Command("fit-scorer --ridge -1", lambda t: [*FIT, *_fit_text(t), "--out", str(t / "s.safetensors"), "--ridge", "-1"], ("--ridge",)),
    Command("fit-scorer --ridge nan", lambda t: [*FIT, *_fit_text(t), "--out", str(t / "s.safetensors"), "--ridge", "nan"], ("--ridge",)),
    Command("fit-scorer --min-future 0", lambda t: [*FIT, *_fit_text(t), "--out", str(t / "s.safetensors"), "--min-future", "0"], ("--min-future",)),
    Command(
        "fit-scorer --min-future leaving no keys",
        lambda t: [*FIT, *_fit_text(t), "--out", str(t / "s.safetensors"), "--length", "64", "--min-future", "60"],
        ("--length", "--min-future"),
    ),
    Command(
        "fit-scorer --length beyond the positions",
        lambda t: [*FIT, *_fit_text(t), "--out", str(t / "s.safetensors"), "--length", "9000"],
        ("--length", "8192"),
    ),
    Command(
        "fit-scorer OUT.partial a folder",
        lambda t: [*FIT, *_fit_text(t), "--out", str(t / "s.safetensors")] if make_folder(t, "s.safetensors.partial") else [],
        ("s.safetensors.partial",),
    ),
    Command(
        "fit-scorer OUT.partial another tool's",
        lambda t: [*FIT, *_fit_text(t), "--out", str(t / "s.safetensors")] if make_file(t, "s.safetensors.partial", "notes") else [],
        ("s.safetensors.partial",),
    ),
    # -- lola export
    Command("export --out empty", lambda t: [*EXPORT, "--out", ""], ("--out",)),
    Command("export --config empty", lambda t: [*EXPORT, "--out", str(t / "e"), "--config", ""], ("--config", "empty")),
    Command("export --config a folder", lambda t: [*EXPORT, "--out", str(t / "e"), "--config", make_folder(t, "c")], ("--config",)),
    Command("export --config of no bytes", lambda t: [*EXPORT, "--out", str(t / "e"), "--config", make_file(t, "c.json")], ("c.json",)),
    Command("export --config a list", lambda t: [*EXPORT, "--out", str(t / "e"), "--config", make_file(t, "c.json", "[1]")], ("c.json", "mapping")),
    Command(
        "export --config an unknown field",
        lambda t: [*EXPORT, "--out", str(t / "e"), "--config", make_file(t, "c.json", '{"windw": 8}')],
        ("--config", "windw"),
    ),
    Command("export --feature-maps empty", lambda t: [*EXPORT, "--out", str(t / "e"), "--feature-maps", ""], ("--feature-maps", "empty")),
    Command("export --out holding another tool's files", lambda t: [*EXPORT, "--out", str(Path(make_file(t, "e/notes.txt", "mine")).parent)], ("--out",)),
    # -- lola linearize
    Command("linearize --out empty", lambda t: [*LIN, "--out", ""], ("--out",)),
    Command("linearize --text empty", lambda t: [*LIN, "--out", str(t / "lin"), "--text", ""], ("--text", "empty")),
    Command("linearize --text missing", lambda t: [*LIN, "--out", str(t / "lin"), "--text", str(t / "no.txt")], ("no.txt",)),
    Command(
        "linearize --stage 2 --feature-maps empty",
        lambda t: ["linearize", "--quick", "--stage", "2", "--out", str(t / "lin"), "--feature-maps", ""],
        ("--feature-maps",),
    ),
    Command(
        "linearize --stage 2 --feature-maps a file",
        lambda t: ["linearize", "--quick", "--stage", "2", "--out", str(t / "lin"), "--feature-maps", make_file(t, "m", b"x")],
        ("m",),
    ),
    Command("linearize --checkpoint-every 0", lambda t: [*LIN, "--out", str(t / "lin"), "--checkpoint-every", "0"], ("--checkpoint-every",)),
    Command("linearize --out holding a garbled journal", lambda t: [*LIN, "--out", garbled_journal(t)], (".lola-pending.json",)),
    # -- lola demo
    Command("demo --length 0", lambda t: ["demo", "--length", "0"], ("--length",)),
    Command("demo --seed empty", lambda t: ["demo", "--seed", ""], ("--seed",)),
]


@pytest.mark.parametrize("command", params(COMMANDS))
def test_a_command_refuses_the_input_in_one_line_and_writes_nothing(command, tmp_path, capsys, request):
    argv = command.argv(tmp_path)
    if command.before_load:
        request.getfixturevalue("no_model")
    before = snapshot(tmp_path)
    try:
        refused(capsys, argv, *command.fragments)
    except SystemExit as exit:  # argparse's refusal: one line naming the option (OneLineParser)
        err = capsys.readouterr().err
        assert exit.code == 2 and err.count("\n") == 1 and all(f in err for f in command.fragments), err
    assert snapshot(tmp_path) == before
    assert not (tmp_path / "results").exists()  # no default folder used instead


# -- bad values ------------------------------------------------------------------------------------


BAD_OPTIONS = [
    (["demo", "--budget", "5"], ["--budget must be an int >= 8"]),
    (["demo", "--budget", "100000", "--length", "256"], ["--budget (100000) must be smaller than --length (256)"]),
    (["demo", "--trials", "0"], ["--trials"]),
    ([*FULL_NIAH, "--lengths", "256", "256"], ["--lengths", "distinct", "256 more than once"]),
    ([*FULL_NIAH, "--lengths", "100000000"], ["--lengths", f"<= {MAX_TOKENS}"]),
    ([*FULL_NIAH, "--methods", "lola", "lola"], ["--methods", "distinct"]),
    ([*FULL_NIAH, "--policies", "sre", "sre"], ["--policies", "distinct"]),
    ([*FULL_NIAH, "--window", "100000000"], ["--window", "less than or equal to"]),
    ([*FULL_NIAH, "--batch-size", "0"], ["--batch-size must be >= 1"]),
    ([*FULL_NIAH, "--samples", "0"], ["--samples"]),
    (["perplexity", "--model", "tiny-random-llama", "--lengths", "64", "64"], ["--lengths", "distinct"]),
    (["perplexity", "--model", "tiny-random-llama", "--policy", "nope"], ["unknown policy 'nope'"]),
    (["perplexity", "--model", "tiny-random-llama", "--lengths", "1"], ["--lengths[0]"]),
    (["calibrate", "--model", "tiny-random-llama", "--prompts", "0", "--out", "x.json"], ["--prompts: Input should be greater than or equal to 1"]),
]


def _option_id(argv: list[str]) -> str:
    """``niah --lengths 256 256`` for ``[*FULL_NIAH, "--lengths", "256", "256"]``."""
    return " ".join(argv[:1] + argv[len(FULL_NIAH) :] if argv[:1] == ["niah"] else argv)


@pytest.mark.parametrize("argv, fragments", BAD_OPTIONS, ids=[_option_id(a) for a, _ in BAD_OPTIONS])
def test_bad_options_are_one_line_before_loading(argv, fragments, capsys, no_model):
    refused(capsys, argv, *fragments)


# -- config files ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, text, fragments",
    [
        ("bad.yaml", "lengths: [400\nsamples: 2\n", ["--config", "bad.yaml is not valid YAML", "line 2"]),
        ("bad.json", '{"lengths": [400,', ["--config", "bad.json is not valid JSON"]),
        ("list.yaml", "- 1\n- 2\n", ["must hold a mapping of options, got list"]),
        ("keys.yaml", "1: 2\n", ["option names must be strings"]),
        ("typo.yaml", "windw: 3\n", ["unknown option 'windw'"]),
        ("bool.yaml", "window: true\n", ["--window", "valid integer"]),
        ("batch.yaml", "batch_size: two\n", ["--batch-size must be an int"]),
        ("binary.json", b"\xff\xfe{}", ["binary.json is not a text file"]),
    ],
)
def test_malformed_config_file_is_one_line_naming_it(name, text, fragments, tmp_path, capsys, no_model):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    before = path.read_bytes()
    refused(capsys, [*FULL_NIAH, "--config", str(path), "--out", str(tmp_path / "o")], *fragments)
    assert path.read_bytes() == before and not (tmp_path / "o").exists()


def test_missing_config_file(tmp_path, capsys, no_model):
    refused(capsys, [*FULL_NIAH, "--config", str(tmp_path / "nope.yaml")], "nope.yaml", "No such file")


@pytest.mark.parametrize(
    "name,text",
    [
        ("run.json", '{"samples": 1, "samples": 2}'),
        ("run.json", '{"variants": {"a": {"window": 8, "window": 16}}}'),
        ("run.yaml", "samples: 1\nsamples: 2\n"),
        ("run.yml", "variants:\n  a:\n    window: 8\n    window: 16\n"),
    ],
)
def test_a_key_given_twice_in_a_config_is_refused(name, text, tmp_path, capsys, no_model):
    (tmp_path / name).write_text(text)
    refused(capsys, [*WINDOW_NIAH, "--config", str(tmp_path / name), "--out", str(tmp_path / "r")], "--config", name, "twice")


@pytest.mark.parametrize("suffix,text", [(".yaml", "x: &x [1, 2]\nvariants: {a: {policy_kwargs: {eps: *x}}}\n"), (".json", "[" * 50_000 + "]" * 50_000)])
def test_option_files_that_expand_or_nest_without_bound_are_refused(suffix, text, tmp_path, capsys, no_model):
    """A YAML alias re-uses a node (kilobytes that expand to 10**8 values); deep nesting
    exhausts the parser's recursion: both are refused naming the file, quickly."""
    path = tmp_path / f"run{suffix}"
    path.write_text(text)
    refused(capsys, [*WINDOW_NIAH, "--config", str(path), "--out", str(tmp_path / "r")], "--config", path.name)


# -- inputs checked before the work they feed ------------------------------------------------------


def test_linearize_stage_2_needs_stage_1_maps(tmp_path, capsys, no_model):
    refused(capsys, ["linearize", "--quick", "--stage", "2", "--out", str(tmp_path / "empty")], "stage 2 starts from stage-1 feature maps")


def _other_feature_dim(meta: dict) -> None:
    meta["lola_config"]["feature_dim"] = 16  # the tensors hold f = 8: refused when applied


def _other_model(meta: dict) -> None:
    meta["geometry"]["num_layers"] = 3  # the tensors cover 2 layers: refused when read


@pytest.mark.parametrize("edit", [_other_feature_dim, _other_model], ids=["a config the tensors do not fit", "maps of another model"])
def test_perplexity_checks_the_feature_maps_before_opening_its_bar(edit, tmp_path, monkeypatch):
    # An error raised under an open bar is printed on the bar's line.
    from lola.eval.perplexity import PerplexityRun, run_perplexity
    from lola.models import tiny_random

    write_random_maps(tmp_path / "maps")
    description = tmp_path / "maps" / "lola_config.json"
    meta = json.loads(description.read_text())
    edit(meta)
    description.write_text(json.dumps(meta))
    text = tmp_path / "text.txt"
    text.write_text("The river bends near the old mill. " * 200)
    bars = []
    monkeypatch.setattr("tqdm.auto.tqdm", lambda *a, **k: bars.append(k) or pytest.fail("the bar opened before the maps were checked"))
    run = PerplexityRun(lengths=[64], methods=["full", "lola"], windows=1, generate=0, text=[str(text)], feature_maps=str(tmp_path / "maps"))
    model, tok = tiny_random()
    with pytest.raises(ValueError):
        run_perplexity(run, model, tok, progress=False)
    assert not bars and not hasattr(model, "_lola")  # and the model is left as it came


# -- options that would do nothing: refused, naming them ---------------------------------------------

NOTHING_DONE = [
    (["linearize", "--quick", "--stage", "1", "--lora-rank", "4"], ["--lora-rank", "stage 2", "--stage 1"]),
    (["linearize", "--quick", "--stage", "1", "--from-lora"], ["--from-lora", "stage 2"]),
    (["linearize", "--quick", "--stage", "1", "--stage2-steps", "3", "--gradient-checkpointing"], ["--stage2-steps, --gradient-checkpointing", "stage 2"]),
    (["linearize", "--quick", "--stage", "2", "--window", "8", "--lr", "0.1"], ["--lr, --window", "stage 1", "--stage 2"]),
    (["niah", "--model", "tiny-random-llama", "--methods", "full", "window", "--linear-decay", "0.9"], ["--linear-decay", "lola method", "['full', 'window']"]),
    (["niah", "--model", "tiny-random-llama", "--methods", "hybrid", "--policies", "sre"], ["--policies", "lola method"]),
    (["niah", "--model", "tiny-random-llama", "--methods", "full", "--fold-repeats", "0.9", "--fold-copies", "2"], ["--fold-repeats, --fold-copies"]),
    (["perplexity", "--model", "tiny-random-llama", "--methods", "full", "hybrid", "--linear-share-cap", "0.5"], ["--linear-share-cap", "lola method"]),
    # every option that sets some methods only (lola.methods.NIAH_SCOPES, PERPLEXITY_SCOPES), and the run's own
    ([*FULL_NIAH, "--positions", "bounded"], ["--positions", "every method but full", "['full']"]),
    ([*FULL_NIAH, "--exact-distance", "512"], ["--exact-distance", "every method but full"]),
    ([*FULL_NIAH, "--window", "16"], ["--window", "every method but full"]),
    ([*FULL_NIAH, "--sinks", "2"], ["--sinks", "every method but full"]),
    ([*WINDOW_NIAH, "--budgets", "uniform"], ["--budgets", "lola method", "['window']"]),
    ([*WINDOW_NIAH, "--mixing", "lolcats"], ["--mixing", "hybrid and lola methods"]),
    ([*WINDOW_NIAH[:-1], "lola", "--policies", "sre", "--fold-repeats", "0.9"], ["--fold-repeats would do nothing", "learned policy only"]),
    ([*WINDOW_NIAH[:-1], "lola", "--fold-copies", "2"], ["--fold-copies would do nothing", "--fold-repeats is 0"]),
    ([*WINDOW_NIAH[:-1], "lola", "--linear-share-cap", "0.5"], ["--linear-share-cap 0.5", "--mixing softmax_only", "no share"]),
    ([*PPL[:-1], "full", "hybrid", "--policy", "recency"], ["--policy", "lola method", "['full', 'hybrid']"]),
    ([*PPL[:-1], "full", "hybrid", "--sparse-size", "32"], ["--sparse-size", "lola method"]),
    ([*PPL[:-1], "full", "hybrid", "--budgets", "auto"], ["--budgets", "lola method"]),
    ([*PPL, "--generate-windows", "3"], ["--generate-windows would do nothing", "--generate is 0"]),
    ([*PPL, "--positions", "bounded"], ["--positions", "hybrid and lola methods", "['full']"]),
    ([*PPL, "--exact-distance", "512"], ["--exact-distance", "hybrid and lola methods"]),
    ([*FIT, "--target", "kvzip", "--min-distance", "8", "--min-future", "16"], ["--min-distance and --min-future", "future target only", "--target kvzip"]),
    ([*LIN, "--feature-map", "hedgehog_identity", "--feature-dim", "32"], ["--feature-dim 32", "hedgehog_identity"]),
    (["linearize", "--quick", "--from-lora"], ["--from-lora", "--feature-maps", "none is given"]),
    ([*SWEEP[:-6], "--budgets", "1/4", "2/8", *SWEEP[-4:]], ["--budgets", "1/4 and 2/8 are one budget written twice"]),
]


@pytest.mark.parametrize("argv, fragments", NOTHING_DONE, ids=[" ".join(a[:1] + a[-2:]) for a, _ in NOTHING_DONE])
def test_an_option_that_affects_nothing_selected_is_refused(argv, fragments, tmp_path, capsys, no_model):
    argv = [*argv, "--out", str(tmp_path / "out")] if argv[0] != "perplexity" else argv
    refused(capsys, argv, *fragments)
    assert not (tmp_path / "out").exists()


def test_maps_or_a_config_key_for_methods_that_do_not_run_are_refused(tmp_path, capsys):
    maps = write_random_maps(tmp_path / "maps")
    refused(capsys, [*FULL_NIAH, "--feature-maps", str(maps), "--out", str(tmp_path / "r")], "--feature-maps", "every method but full")
    config = tmp_path / "opts.yaml"
    config.write_text("gqa_storage: query_head\n")
    # a key of the file is named as the file's, not as an option
    refused(capsys, [*FULL_NIAH, "--config", str(config), "--out", str(tmp_path / "r")], f"gqa_storage (in --config {config})", "every method but full")
    assert not (tmp_path / "r").exists()


def test_distinct_with_more_copies_than_a_step_scores_is_refused():
    # copies=1000 with a sparse cache of 64 and a chunk of 64: no candidate ever repeats 1000
    # others, so the fold would never happen (the same as no distinct at all).
    import lola

    with pytest.raises(ValueError, match=r"distinct keeps 1000 copies, but a step scores at most 128 candidates"):
        lola.LoLAConfig(policy="distinct", policy_kwargs={"policy": "sre", "copies": 1000})
    with pytest.raises(ValueError, match=r"at most 16 candidates"):  # per-head sizes: the largest head's, plus one period
        lola.LoLAConfig(window=8, sparse_size=4, chunk=4, sparse_size_per_head=[12, 4], policy="distinct", policy_kwargs={"copies": 16})
    assert lola.LoLAConfig(policy="distinct", policy_kwargs={"copies": 127}).policy_kwargs["copies"] == 127
