"""Hostile inputs: the one reader of option files, the one reader of text, bounds and memory.

- :func:`lola.io.outputs.read_mapping` reads every file of options (``--config``, lm-eval's
  ``lola_config``) and :func:`lola.io.outputs.read_json` every JSON lola reads back: regular files
  only (a FIFO would block), a key given twice refused (both parsers keep the last);
- :func:`lola.data.text.read_text_file`: NUL bytes anywhere, not only near the start; a text file
  listed twice is refused (it would sit on both sides of a train/held-out split);
- budgets files are strict (no bool or float sizes, no negative scores, bounded sizes);
- sizes and scales are bounded before use, lm-eval's own sizes included, and the memory check
  sees the process's address-space limit (``ulimit -v``), not only the machine's free memory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lola.cli import main

from .common import refused

transformers = pytest.importorskip("transformers")

NIAH = ["niah", "--model", "tiny-random-llama", "--lengths", "400", "--samples", "1", "--methods", "window"]


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
    refused(capsys, [*NIAH, "--config", str(tmp_path / name), "--out", str(tmp_path / "r")], "--config", name, "twice")


@pytest.mark.parametrize("option", ["--config", "--haystack-file"])
@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_inputs_that_are_not_regular_files_are_refused_without_blocking(option, kind, tmp_path, capsys, no_model):
    path = tmp_path / ("in.json" if option == "--config" else "hay.txt")
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    refused(capsys, [*NIAH, option, str(path), "--out", str(tmp_path / "r")], path.name)


@pytest.mark.parametrize("text", ['{"window": 8, "window": 16}', "window: 8\nwindow: 16\n"])
def test_lm_eval_lola_config_files_are_read_the_same_way(text, tmp_path):
    from lola.integrations.lm_eval.model import read_lola_config

    path = tmp_path / ("c.yaml" if text.startswith("window:") else "c.json")
    path.write_text(text)
    with pytest.raises(ValueError, match=r"model_args lola_config .*c\.(json|yaml).*twice"):
        read_lola_config(path)
    path.write_bytes(b"\xff\xfe\x00\x01")
    with pytest.raises(ValueError, match="model_args lola_config .* not a text file"):
        read_lola_config(path)


@pytest.mark.parametrize("offset", [70_000, 300_000])
def test_nul_bytes_far_into_a_text_are_found(offset, tmp_path):
    from lola.data.text import read_text_file

    path = tmp_path / "t.txt"
    path.write_bytes(b"plain words. " * (offset // 13) + b"\x00\x00tail")
    with pytest.raises(ValueError, match=r"t.txt.*NUL bytes.*byte"):
        read_text_file(path)


def test_a_text_file_listed_twice_is_refused(tmp_path):
    from lola.data.text import load_documents

    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "a.txt").write_text("one document. " * 20)
    for sources in ([str(folder / "a.txt"), str(folder / "a.txt")], [str(folder), str(folder / "a.txt")], [str(folder / "a.txt"), str(folder / "." / "a.txt")]):
        with pytest.raises(ValueError, match="a.txt.*twice"):
            load_documents(sources)


GOOD_BUDGETS = {"sparse_size_per_head": [[4, 2], [2, 0]], "uniform_sparse_size": 2, "scores": [[2.0, 1.0], [1.0, 0.0]], "power": 0.5}


@pytest.mark.parametrize(
    "field,value",
    [
        ("uniform_sparse_size", True),
        ("uniform_sparse_size", 2.0),
        ("sparse_size_per_head", [[4.0, 2], [2, 0]]),
        ("sparse_size_per_head", [[True, 2], [2, 0]]),
        ("scores", [[2.0, -1.0], [1.0, 0.0]]),
        ("power", False),
        ("sparse_size_per_head", [[2**25, 0], [0, 0]]),
    ],
)
def test_budgets_files_are_strict(field, value, tmp_path):
    from lola import budgets

    path = tmp_path / "b.json"
    path.write_text(json.dumps({**GOOD_BUDGETS, field: value}))
    with pytest.raises(ValueError, match=rf"b.json is not a valid budgets file: {field}"):
        budgets.load(path)
    path.write_text(json.dumps(GOOD_BUDGETS))
    assert budgets.load(path).num_layers == 2  # the good one loads


def test_budgets_with_a_key_twice_are_refused(tmp_path):
    from lola import budgets

    path = tmp_path / "b.json"
    path.write_text(json.dumps(GOOD_BUDGETS)[:-1] + ', "power": 2.0}')
    with pytest.raises(ValueError, match="b.json.*'power' appears twice"):
        budgets.load(path)


@pytest.mark.parametrize("scale", [1e300, 1e4, 1001.0])
def test_the_attention_scale_is_bounded(scale):
    from pydantic import ValidationError

    import lola

    with pytest.raises(ValidationError, match="scale"):
        lola.LoLAConfig(scale=scale)
    assert lola.LoLAConfig(scale=0.125).scale == 0.125


@pytest.mark.parametrize("option,value", [("--sparse-size", str(2**25)), ("--floor", "300"), ("--length", str(2**25))])
def test_calibrate_sizes_are_bounded_before_the_model_loads(option, value, tmp_path, capsys, no_model):
    refused(capsys, ["calibrate", "--model", "tiny-random-llama", "--out", str(tmp_path / "b.json"), option, value], option)


@pytest.mark.parametrize("arg", ["lola_config", "feature_maps", "budgets"])
def test_lm_eval_path_model_args_given_a_number_are_named(arg):
    from lola.integrations.lm_eval.model import lola_config_from_args

    with pytest.raises(TypeError, match=f"model_args {arg}.* must be a name or a path, got 7"):
        lola_config_from_args(**{arg: 7})


@pytest.mark.parametrize("arg,value", [("batch_size", -2), ("batch_size", "many"), ("max_length", 0), ("max_batch_size", 1.5), ("max_length", True)])
def test_lm_eval_sizes_are_checked_before_hflm_sees_them(arg, value):
    from lola.integrations.lm_eval.model import _check_hflm_sizes

    with pytest.raises(ValueError, match=f"model_args {arg} must be"):
        _check_hflm_sizes({arg: value})
    ok = {"batch_size": "auto:4", "max_length": "512", "max_batch_size": 8.0}
    _check_hflm_sizes(ok)
    assert ok == {"batch_size": "auto:4", "max_length": 512, "max_batch_size": 8}


def test_export_niah_refuses_lengths_beyond_the_model_s_positions(tmp_path, capsys):
    from lola.integrations.lm_eval.__main__ import export_main

    assert export_main(["--out", str(tmp_path / "t"), "--model", "tiny-random-llama", "--lengths", "512", "8193", "--samples", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("export-niah: error: --lengths: 8193") and "8192 positions" in err and not (tmp_path / "t").exists()


def test_max_positions_is_read_without_loading(tmp_path):
    from lola.models import max_positions

    assert max_positions("tiny-random-llama") == 8192 and max_positions("smollm2-135m-instruct") == 8192
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 2048}')
    assert max_positions(tmp_path) == 2048
    assert max_positions(tmp_path / "nothing") is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="address-space limits are read from /proc")
def test_the_memory_check_sees_the_address_space_limit():
    """Under ``ulimit -v`` a state beyond the limit is refused by name, not an allocator crash."""
    code = """
import resource
resource.setrlimit(resource.RLIMIT_AS, (6 * 2**30, resource.RLIM_INFINITY))
import torch
from lola.memory.allocation import available_bytes, check_allocation
free = available_bytes("cpu")
assert free is not None and free < 6 * 2**30, free
try:
    check_allocation(8 * 2**30, torch.device("cpu"), "window 16777216 x 64 heads")
except MemoryError as err:
    assert "window 16777216" in str(err) and "GiB" in str(err), err
else:
    raise SystemExit("not refused")
"""
    subprocess.run([sys.executable, "-c", code], check=True)


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


@pytest.mark.parametrize("suffix,text", [(".yaml", "x: &x [1, 2]\nvariants: {a: {policy_kwargs: {eps: *x}}}\n"), (".json", "[" * 50_000 + "]" * 50_000)])
def test_option_files_that_expand_or_nest_without_bound_are_refused(suffix, text, tmp_path, capsys, no_model):
    """A YAML alias re-uses a node (kilobytes that expand to 10**8 values); deep nesting
    exhausts the parser's recursion: both are refused naming the file, quickly."""
    path = tmp_path / f"run{suffix}"
    path.write_text(text)
    refused(capsys, [*NIAH, "--config", str(path), "--out", str(tmp_path / "r")], "--config", path.name)


def test_messages_quote_a_short_part_of_huge_values():
    from lola.errors import short_repr

    huge = {"eps": [0.5] * 10**6, "name": "x" * 10**6}
    assert len(short_repr(huge)) < 400 and short_repr("abc") == "'abc'" and short_repr(-1.0) == "-1.0"


def test_a_text_too_large_to_read_whole_is_refused_by_name(tmp_path):
    from lola.data.text import MAX_TEXT_BYTES, read_text_file

    path = tmp_path / "huge.txt"
    with open(path, "wb") as f:  # sparse: no disk used
        f.truncate(MAX_TEXT_BYTES + 1)
    with pytest.raises(ValueError, match=r"huge.txt.*GiB"):
        read_text_file(path)


def test_one_file_under_two_names_is_one_text_listed_twice(tmp_path):
    from lola.data.text import load_documents

    (tmp_path / "a.txt").write_text("one document. " * 20)
    os.link(tmp_path / "a.txt", tmp_path / "b.txt")
    with pytest.raises(ValueError, match="twice"):
        load_documents([str(tmp_path / "a.txt"), str(tmp_path / "b.txt")])


def test_the_export_never_reads_a_fifo_in_its_old_files_place(tmp_path):
    from lola.integrations.lm_eval.niah import _exported_by_us

    os.mkfifo(tmp_path / "lola_niah_single_1_utils.py")
    assert _exported_by_us(tmp_path / "lola_niah_single_1_utils.py") is False  # returns, never blocks
