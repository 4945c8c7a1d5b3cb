"""Hostile inputs, class ``messages``: every refusal names the input at fault, on one line.

The mechanism (:mod:`lola.errors`): registries raise :class:`~lola.errors.UnknownName` (a
``KeyError`` whose text is its sentence, never the bare quoted key); an error raised while one
input is consumed is re-raised naming it (:func:`~lola.errors.about`); and every command —
``lola``, ``export-niah``, the lm-eval entry — ends in :func:`~lola.errors.report`: one line
``PROG: error: MESSAGE``, exit status 2, or a traceback for what is a bug.

Tested on the mechanism itself (properties), on the examples the issue names (templates with
unknown placeholders, ``export-niah --out`` on a file or an unwritable place, lm-eval reading
``-1`` as a float, budgets of another model), and as a class: every option of every ``lola``
command given a bad value is refused naming the option or the value.
"""

from __future__ import annotations

import argparse
import ast
import os
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from lola.cli import build_parser, main
from lola.errors import InputError, UnknownName, about, describe, report
from lola.eval.runner import NiahRun
from tests.hostile.common import WINDOW_NIAH, refused

transformers = pytest.importorskip("transformers")
SRC = Path(__file__).resolve().parents[2] / "src" / "lola"


def one_line(err: str, prog: str) -> str:
    """The single stderr line of a refusal by ``prog``."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), err
    return lines[0]


# -- the mechanism ---------------------------------------------------------------------------------


@given(st.text(min_size=1, max_size=60), st.sampled_from([ValueError, TypeError, KeyError, FileNotFoundError]))
def test_about_names_the_input_on_one_line(text, kind):
    assume(not text.startswith("--budgets"))  # a message naming its input passes unchanged
    with pytest.raises(InputError) as caught:
        with about("--budgets"):
            raise kind(text)
    message = str(caught.value)
    assert message.startswith("--budgets: ") and "\n" not in describe(caught.value)
    assert caught.value.input == "--budgets" and isinstance(caught.value.__cause__, kind)
    assert " ".join(text.split()) in describe(caught.value)  # the original text, folded, never lost


def test_about_keeps_an_error_that_names_its_input_and_passes_bugs():
    with pytest.raises(InputError) as caught:
        with about("--model"):
            raise InputError("--feature-maps", "damaged")
    assert caught.value.input == "--feature-maps"
    with pytest.raises(AttributeError):  # a bug is not an input error: not re-labelled
        with about("--model"):
            raise AttributeError("no attribute x")


@given(st.text(min_size=1, max_size=40))
def test_unknown_name_reads_as_its_sentence(text):
    err = UnknownName(text)
    assert isinstance(err, KeyError) and isinstance(err, ValueError)
    assert str(err) == text and describe(err) == " ".join(text.split())


def test_report_prints_one_line_for_input_errors_and_keeps_tracebacks_for_bugs(capsys):
    assert report("lola niah", ValueError("--lengths: must be\n>= 64")) == 2
    assert capsys.readouterr().err == "lola niah: error: --lengths: must be >= 64\n"
    assert report("lola niah", RuntimeError("download failed")) == 2
    assert "--debug" in one_line(capsys.readouterr().err, "lola niah")
    for bug in (KeyError("window"), AttributeError("x"), IndexError("list index out of range")):
        with pytest.raises(type(bug)):
            report("lola niah", bug)
    with pytest.raises(ValueError):
        report("lola niah", ValueError("bad"), debug=True)


def test_a_refused_allocation_is_one_line(capsys):
    from lola.errors import report

    assert report("lola niah", MemoryError("window 2**24 needs 2.00 GiB on cpu, but only 1.00 GiB is free")) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("argv", [["niah", "--window", "x"], ["niah", "--lengths"], ["calibrate", "--power", "lots"], ["nope"]])
def test_argparse_refusals_are_one_line_too(argv, capsys):
    with pytest.raises(SystemExit) as exit:
        main(argv)
    err = capsys.readouterr().err
    assert exit.value.code == 2 and err.count("\n") == 1 and "error: " in err and "--help" in err, err


def test_messages_quote_a_short_part_of_huge_values():
    from lola.errors import short_repr

    huge = {"eps": [0.5] * 10**6, "name": "x" * 10**6}
    assert len(short_repr(huge)) < 400 and short_repr("abc") == "'abc'" and short_repr(-1.0) == "-1.0"


def test_debug_flag_and_environment_show_the_traceback(monkeypatch, capsys):
    with pytest.raises(ValueError, match="--budget"):
        main(["demo", "--budget", "5", "--debug"])
    monkeypatch.setenv("LOLA_DEBUG", "1")
    with pytest.raises(ValueError, match="--budget"):
        main(["demo", "--budget", "5"])
    monkeypatch.setenv("LOLA_DEBUG", "0")
    refused(capsys, ["demo", "--budget", "5"], "--budget")


def test_real_bugs_are_not_swallowed(monkeypatch):
    def broken(**kwargs):
        raise AttributeError("a bug, not bad input")

    monkeypatch.setattr("lola.eval.demo.run_demo", broken)
    with pytest.raises(AttributeError, match="a bug"):
        main(["demo", "--length", "64", "--budget", "16"])


# -- unknown names ---------------------------------------------------------------------------------


def test_no_lookup_of_user_input_raises_a_bare_key_error():
    """Every ``raise KeyError(...)`` in lola would print as its quoted repr: registries raise
    UnknownName instead (a KeyError still, for callers that catch one)."""
    offenders = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and getattr(node.exc.func, "id", None) == "KeyError":
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not offenders, offenders


LOOKUPS = {
    "policy": lambda: __import__("lola.policies", fromlist=["get"]).get("no-such-policy"),
    "model": lambda: __import__("lola.models", fromlist=["fetch"]).fetch("no-such-model"),
    "shipped maps": lambda: __import__("lola.pretrained.shipped", fromlist=["shipped_folder"]).shipped_folder("no-such-maps"),
    "corpus": lambda: __import__("lola.data.corpora", fromlist=["fetch_corpus"]).fetch_corpus("no-such-corpus"),
}


@pytest.mark.parametrize("what", sorted(LOOKUPS))
def test_unknown_names_say_what_is_unknown_and_what_exists(what):
    with pytest.raises(KeyError) as caught:
        LOOKUPS[what]()
    text = describe(caught.value)
    assert isinstance(caught.value, ValueError) and not text.startswith(("'", '"')), text
    assert "no-such" in text and ("available" in text or "registered" in text or "shipped" in text), text


# -- the examples: templates, export-niah --out, model folders, budgets, lm-eval model_args --------


BAD_TEMPLATES = [
    ("--needle", "The {key} is {value} {oops}", "{oops}"),
    ("--needle", "The {key} is {value", "needle template"),
    ("--needle", "The {key.upper} is {value}", "{key.upper}"),
    ("--needle", "The {0} is {key} {value}", "{0}"),
    ("--needle", "The key is {value}", "{key}"),
    ("--question", "What is {value}?", "{value}"),
    ("--question", "What is {key}}?", "question template"),
    ("--answer-prefix", "The {key} is {value}", "{value}"),
    ("--answer-prefix", "{type} of {key}", "{type}"),
]


@pytest.mark.parametrize("option,template,fragment", BAD_TEMPLATES)
def test_niah_names_a_bad_template_before_the_model_loads(option, template, fragment, capsys, no_model, tmp_path):
    given = {"--needle": "The {key} is {value}.", "--question": "What is {key}?", "--answer-prefix": "The {key} is"}
    given[option] = template
    argv = [*WINDOW_NIAH, "--out", str(tmp_path / "r")] + [x for kv in given.items() for x in kv]
    assert main(argv) == 2
    line = one_line(capsys.readouterr().err, "lola niah")
    assert (option in line or option[2:].replace("-", "_") in line) and fragment in line, line
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("option,template,fragment", BAD_TEMPLATES[:4])
def test_export_niah_names_a_bad_template(option, template, fragment, capsys, tmp_path):
    from lola.integrations.lm_eval.__main__ import export_main

    argv = ["--out", str(tmp_path / "t"), "--model", "tiny-random-llama", "--lengths", "512", "--samples", "1", "--question", "What is {key}?"]
    assert export_main([*argv, option, template]) == 2
    line = one_line(capsys.readouterr().err, "export-niah")
    assert fragment in line, line
    assert not (tmp_path / "t").exists()


def _unwritable(tmp_path: Path) -> Path:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    return locked / "tasks"


EXPORT_OUTS = {
    "a file": lambda tmp: (tmp / "afile").write_text("mine") and tmp / "afile",
    "under a file": lambda tmp: (tmp / "afile").write_text("mine") and tmp / "afile" / "tasks",
    "unwritable": _unwritable,
}


@pytest.mark.parametrize("where", sorted(EXPORT_OUTS))
def test_export_niah_names_an_out_it_cannot_write_before_the_tokenizer_loads(where, tmp_path, capsys, monkeypatch):
    from lola.integrations.lm_eval import __main__ as entry

    if where == "unwritable" and os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")

    def refuse(*args, **kwargs):
        raise AssertionError("the tokenizer was loaded before --out was checked")

    monkeypatch.setattr("lola.integrations.lm_eval.niah.load_tokenizer", refuse)
    out = EXPORT_OUTS[where](tmp_path)
    assert entry.export_main(["--out", str(out), "--model", "tiny-random-llama"]) == 2
    line = one_line(capsys.readouterr().err, "export-niah")
    assert "--out" in line and str(out) in line, line
    if (tmp_path / "afile").exists():
        assert (tmp_path / "afile").read_text() == "mine"


@pytest.mark.parametrize("command", ["niah", "export-niah"])
def test_a_folder_that_is_no_model_is_named_as_the_model(command, tmp_path, capsys):
    from lola.integrations.lm_eval.__main__ import export_main

    empty = tmp_path / "not-a-model"
    empty.mkdir()
    if command == "niah":
        assert main(["niah", "--model", str(empty), "--lengths", "400", "--samples", "1", "--out", str(tmp_path / "r")]) == 2
        line = one_line(capsys.readouterr().err, "lola niah")
        assert "--model" in line
    else:
        assert export_main(["--out", str(tmp_path / "t"), "--model", str(empty)]) == 2
        line = one_line(capsys.readouterr().err, "export-niah")
    assert "not-a-model" in line and "config.json" in line, line


def test_niah_names_budgets_of_another_model_and_writes_nothing(tmp_path, capsys):
    argv = ["niah", "--model", "tiny-random-llama", "--lengths", "400", "--samples", "1", "--methods", "lola", "--budgets", "smollm2-135m-instruct"]
    assert main([*argv, "--out", str(tmp_path / "r")]) == 2
    line = one_line(capsys.readouterr().err, "lola niah")
    assert "--budgets smollm2-135m-instruct" in line and "30 layers" in line and "2 layers" in line, line
    assert not (tmp_path / "r").exists()


def test_niah_names_a_variant_s_budgets_of_another_model(tmp_path, capsys):
    config = tmp_path / "run.json"
    config.write_text('{"variants": {"cal": {"budgets": "smollm2-135m-instruct"}}}')
    argv = ["niah", "--model", "tiny-random-llama", "--lengths", "400", "--samples", "1", "--methods", "lola", "--config", str(config)]
    assert main([*argv, "--out", str(tmp_path / "r")]) == 2
    line = one_line(capsys.readouterr().err, "lola niah")
    assert "variants.cal.budgets" in line, line


def test_a_variant_budgets_of_the_wrong_type_names_the_variant():
    with pytest.raises(ValueError, match="variants.cal.budgets"):
        NiahRun(methods=["lola"], variants={"cal": {"budgets": 8}})


def test_budgets_refuse_another_geometry():
    from lola import budgets

    cal = budgets.load("smollm2-135m-instruct")
    cal.check_geometry(cal.num_layers, cal.num_kv_heads)  # its own model: accepted
    for layers, heads in ((2, cal.num_kv_heads), (cal.num_layers, 1)):
        with pytest.raises(ValueError, match=rf"{cal.num_layers} layers x {cal.num_kv_heads} K/V heads.*{layers} layers x {heads} K/V heads"):
            cal.check_geometry(layers, heads)


@pytest.mark.parametrize("arg", ["lola_config", "feature_maps", "budgets"])
def test_lm_eval_path_model_args_given_a_number_are_named(arg):
    from lola.integrations.lm_eval.model import lola_config_from_args

    with pytest.raises(TypeError, match=f"model_args {arg}.* must be a name or a path, got 7"):
        lola_config_from_args(**{arg: 7})


@pytest.mark.parametrize("value,expected", [(-1.0, -1), (64.0, 64), (1.5, 1.5), ("-1", "-1"), (True, True), ('{"a": 1}', {"a": 1})])
def test_lm_eval_reads_a_whole_number_as_the_int_it_was_written_as(value, expected):
    from lola.integrations.lm_eval.model import _parse_value

    got = _parse_value(value)
    assert got == expected and type(got) is type(expected)


# Through lm-eval's own command line (about 10 s each: lm-eval indexes its tasks), one per way
# a model_arg goes wrong: a number lm-eval parses, a name, a file of another model.
LM_EVAL_BAD_ARGS = {
    "window=-1": "model_args window",
    "windwo=3": "'window'",
    "budgets=smollm2-135m-instruct": "model_args budgets",
}


@pytest.fixture(scope="module")
def niah_tasks(tmp_path_factory):
    from lola.integrations.lm_eval.niah import export_niah
    from lola.models import tiny_random

    folder = tmp_path_factory.mktemp("tasks")
    export_niah(folder, tiny_random()[1], lengths=[512], samples=1)
    return folder


@pytest.mark.parametrize("arg", sorted(LM_EVAL_BAD_ARGS))
def test_lm_eval_names_a_bad_model_arg_on_one_line(arg, niah_tasks, capsys):
    pytest.importorskip("lm_eval")
    from lola.integrations.lm_eval.__main__ import lm_eval_main

    argv = ["run", "--model_args", f"pretrained=tiny-random-llama,window=8,sparse_size=8,{arg}", "--tasks", "lola_niah_single_1"]
    assert lm_eval_main([*argv, "--include_path", str(niah_tasks), "--device", "cpu"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("lm-eval: error: ")]
    assert len(lines) == 1 and LM_EVAL_BAD_ARGS[arg] in lines[0], lines


# -- every option of every command -----------------------------------------------------------------


# The smallest valid run of each command; one option at a time is then replaced.
BASE = {
    "niah": [*WINDOW_NIAH[1:], "--out", "r"],
    "probe": [*WINDOW_NIAH[1:-1], "lola", "--out", "r"],
    "sweep": [
        "--model",
        "tiny-random-llama",
        "--feature-maps",
        "none",
        "--lengths",
        "600",
        "--budgets",
        "1/4",
        "--haystacks",
        "noise",
        "--samples",
        "1",
        "--out",
        "w",
    ],
    "perplexity": ["--model", "tiny-random-llama", "--length", "256", "--out", "p.json"],
    "calibrate": ["--model", "tiny-random-llama", "--out", "b.json"],
    "export": ["--model", "tiny-random-llama", "--out", "e"],
    "fit-scorer": [
        "--model",
        "tiny-random-llama",
        "--out",
        "s.safetensors",
        "--length",
        "128",
        "--documents",
        "1",
        "--heldout",
        "1",
        "--min-future",
        "16",
        "--min-distance",
        "16",
        "--text",
        "pydoc",
    ],
    "linearize": ["--quick", "--out", "lin"],
    "demo": [],
}


# Options for which these values are valid: a negative seed, a folder named "-1".
VALID = {"--seed": {"-1"}, "--out": {"-1", "no-such-thing"}}


def _options():
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for command, sub in commands.items():
        for action in sub._actions:
            if not action.option_strings or action.nargs == 0 or action.dest == "help":
                continue
            flag = action.option_strings[-1]
            for bad in ("-1", "no-such-thing"):
                if bad not in VALID.get(flag, ()):
                    yield pytest.param(command, flag, bad, id=f"{command} {flag} {bad}")


@pytest.mark.parametrize("command,flag,bad", list(_options()))
def test_every_option_given_a_bad_value_is_refused_naming_it(command, flag, bad, capsys):
    argv = [command, *BASE[command]]
    if flag in argv:
        i = argv.index(flag)
        argv = argv[:i] + argv[i + 2 :]
    try:
        status = main([*argv, flag, bad])
    except SystemExit as exit:  # argparse's own refusal (usage + one error line naming the argument)
        status = exit.code
    err = capsys.readouterr().err
    assert status == 2, err
    line = err.strip().splitlines()[-1]
    assert line.startswith((f"lola {command}: error: ", "lola: error: ")) or "usage" in err, err
    named = (flag, flag[2:], flag[2:].replace("-", "_"), bad)
    assert any(n in line for n in named), line


# -- a run spec's or config's message names the command's options, not the fields they set -----------

_LOLA_NIAH = [*WINDOW_NIAH[:-1], "lola", "--max-new-tokens", "1", "--window", "8", "--sparse-size", "8"]
_PPL_LOLA = ["perplexity", "--model", "tiny-random-llama", "--lengths", "64", "--windows", "1", "--generate", "0", "--methods", "lola"]

FIELDS_AS_OPTIONS = [
    ([*_LOLA_NIAH, "--linear-share-cap-from", "64"], ["--linear-share-cap-from 64", "--linear-share-cap is None"]),
    ([*_PPL_LOLA, "--exact-distance", "512"], ["--exact-distance bound", "--positions bounded"]),
    ([*_LOLA_NIAH, "--state-positions", "512"], ["--state-positions bound", "--positions bounded"]),
    ([*_LOLA_NIAH, "--positions", "bounded", "--exact-distance", "4"], ["--exact-distance 4 is shorter than the window"]),
    (
        ["probe", "--model", "tiny-random-llama", "--lengths", "400", "--samples", "1", "--methods", "hybrid", "--exact-distance", "512"],
        ["--exact-distance bound"],
    ),
]


@pytest.mark.parametrize("argv, fragments", FIELDS_AS_OPTIONS, ids=[" ".join(a[:1] + a[-2:]) for a, _ in FIELDS_AS_OPTIONS])
def test_a_run_specs_message_names_the_option_not_the_field(argv, fragments, tmp_path, capsys, no_model):
    line = refused(capsys, [*argv, "--out", str(tmp_path / "out")], *fragments)
    assert "_" not in line.split("error:", 1)[1].split("/")[0], line  # no field name (paths aside)


def test_sweep_budget_without_room_names_budgets(tmp_path, capsys):
    # refused once the model is loaded (the tiny model is cheap)
    argv = ["sweep", "--model", "tiny-random-llama", "--lengths", "400", "--budgets", "1/400", "--haystacks", "noise", "--samples", "1"]
    refused(capsys, [*argv, "--out", str(tmp_path / "s")], "--budgets: 1/400")


def test_probe_without_a_state_names_methods(tmp_path, capsys):
    # refused once the model is loaded (the tiny model is cheap): the line names --methods
    argv = ["probe", "--model", "tiny-random-llama", "--lengths", "400", "--samples", "1", "--methods", "full", "window", "--max-new-tokens", "1"]
    refused(capsys, [*argv, "--out", str(tmp_path / "p")], "--methods ['full', 'window'] hold no linear state")


def test_name_options_leaves_words_paths_and_named_options_alone():
    from lola.errors import name_options

    options = {"window": "--window", "feature_maps": "--feature-maps", "length": "--length", "positions": "--positions"}
    text = "the window of /a/feature_maps/b (feature_maps.safetensors), length (--length) 5, positions='bounded'"
    assert name_options(text, options) == "the window of /a/feature_maps/b (feature_maps.safetensors), length (--length) 5, --positions bounded"


def test_lm_eval_config_file_error_is_one_line_naming_the_file(tmp_path):
    from lola.integrations.lm_eval.model import lola_config_from_args

    path = tmp_path / "c.yaml"
    path.write_text("window: 8\nexact_distance: 512\n")
    with pytest.raises(ValueError) as err:
        lola_config_from_args(str(path))
    assert str(path) in str(err.value) and "exact_distance" in str(err.value) and "\n" not in str(err.value)
