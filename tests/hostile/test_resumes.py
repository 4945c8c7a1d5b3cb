"""Hostile inputs, class 3 (resumes that mix inputs): a run fingerprints the content it reads,
not its path, and a resume on other content under the same path is refused, naming the option.

The mechanism: :func:`lola.io.checksums.content_digest` (a file's or a folder's content) and
:func:`lola.io.checksums.changed_inputs`; ``lola niah`` records the fingerprints of its haystack,
feature maps and budget files in ``results.json`` (:func:`lola.eval.runner.run_inputs`),
``lola linearize`` records its text's (:func:`lola.data.text.source_digest`) in every checkpoint.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from lola.cli import main
from lola.data.text import source_digest
from lola.io.checksums import changed_inputs, content_digest
from tests.hostile.common import write_random_maps

transformers = pytest.importorskip("transformers")


# --- the fingerprints ---------------------------------------------------------------------------


def test_content_not_path(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("same")
    b.write_text("same")
    assert content_digest(a) == content_digest(b)
    b.write_text("other")
    assert content_digest(a) != content_digest(b)
    (tmp_path / "d1").mkdir()
    (tmp_path / "d2").mkdir()
    for d in ("d1", "d2"):
        (tmp_path / d / "x.txt").write_text("x")
    assert content_digest(tmp_path / "d1") == content_digest(tmp_path / "d2")
    (tmp_path / "d2" / "x.txt").rename(tmp_path / "d2" / "y.txt")  # the same bytes under another name
    assert content_digest(tmp_path / "d1") != content_digest(tmp_path / "d2")
    with pytest.raises(FileNotFoundError):
        content_digest(tmp_path / "missing")


def test_text_sources_are_fingerprinted_by_content(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("one")
    before = source_digest([str(f), "pydoc"])
    assert source_digest([str(f), "pydoc"]) == before
    f.write_text("two")
    assert source_digest([str(f), "pydoc"]) != before
    assert source_digest(None) == source_digest("default") != source_digest("pydoc")


def test_changed_inputs_compares_what_both_recorded():
    assert changed_inputs({"a": "1", "b": "2"}, {"a": "1", "b": "3"}) == ["b"]
    assert changed_inputs(None, {"a": "1"}) == []  # a run from before fingerprints
    assert changed_inputs({"a": "1"}, {"a": "1", "new": "x"}) == []


# --- lola niah ------------------------------------------------------------------------------------

NIAH = ["niah", "--model", "tiny-random-llama", "--lengths", "400", "--samples", "1", "--max-new-tokens", "1"]


def _niah(out, *extra):
    return main([*NIAH, "--out", str(out), *extra])


def test_niah_resume_on_a_changed_haystack_is_refused(tmp_path, capsys):
    hay = tmp_path / "hay.txt"
    hay.write_text("The grass is green. The sky is blue. " * 200)
    assert _niah(tmp_path / "r", "--methods", "full", "--haystack-file", str(hay)) == 0
    assert _niah(tmp_path / "r", "--methods", "full", "--haystack-file", str(hay)) == 0  # same content: resumes (nothing left)
    saved = json.loads((tmp_path / "r" / "results.json").read_text())
    assert saved["inputs"]["haystack_file"] == content_digest(hay)
    capsys.readouterr()
    hay.write_text("Completely different text about rivers. " * 200)
    before = (tmp_path / "r" / "results.json").read_bytes()
    assert _niah(tmp_path / "r", "--methods", "full", "--haystack-file", str(hay)) == 2
    err = capsys.readouterr().err
    assert "--haystack-file changed since it started" in err and err.count("\n") == 1
    assert (tmp_path / "r" / "results.json").read_bytes() == before


def _maps_folder(folder, seed):
    write_random_maps(folder, seed)


def test_niah_resume_on_retrained_feature_maps_is_refused(tmp_path, capsys):
    maps = tmp_path / "maps"
    _maps_folder(maps, seed=0)
    args = ["--methods", "lolcats", "--feature-maps", str(maps), "--window", "16", "--sparse-size", "8"]
    assert _niah(tmp_path / "r", *args) == 0
    capsys.readouterr()
    shutil.rmtree(maps)
    _maps_folder(maps, seed=1)  # retrained into the same folder
    assert _niah(tmp_path / "r", *args) == 2
    assert "--feature-maps changed since it started" in capsys.readouterr().err


def test_niah_resume_on_a_rewritten_budgets_file_is_refused(tmp_path, capsys):
    from lola import budgets
    from lola.models import tiny_random

    model, _ = tiny_random()
    layers, kv = model.config.num_hidden_layers, model.config.num_key_value_heads
    scores = torch.rand(layers, kv)
    path = tmp_path / "b.json"

    def made(s):
        return budgets.HeadBudgets(uniform_sparse_size=8, sparse_size_per_head=budgets.allocate(s, 8).tolist(), scores=s.tolist(), power=0.5)

    made(scores).save(path)
    args = ["--methods", "lola", "--window", "16", "--sparse-size", "8", "--budgets", str(path)]
    assert _niah(tmp_path / "r", *args) == 0
    capsys.readouterr()
    made(torch.tensor([[1.0] + [0.0] * (kv - 1)] * layers)).save(path)  # recalibrated into the same file
    assert _niah(tmp_path / "r", *args) == 2
    assert "--budgets changed since it started" in capsys.readouterr().err


# --- lola linearize -----------------------------------------------------------------------------


def test_linearize_resume_on_a_changed_text_is_refused(tmp_path):
    from lola.linearize import LinearizeConfig, linearize
    from lola.models import tiny_random

    text = tmp_path / "train.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 400)
    cfg = LinearizeConfig(steps=2, chunk_tokens=64, train_chunks=1, eval_chunks=1, window=8, checkpoint_every=1, text=[str(text)])
    model, tok = tiny_random()
    linearize(model, tok, cfg, tmp_path / "out", progress=False, log=lambda s: None)
    more = cfg.model_copy(update={"steps": 3})
    text.write_text("Entirely other words for the second run, about ships. " * 400)
    with pytest.raises(ValueError, match=r"--text .* changed since"):
        linearize(model, tok, more, tmp_path / "out", progress=False, log=lambda s: None)
    text.write_text("The quick brown fox jumps over the lazy dog. " * 400)  # restored: resumes
    linearize(model, tok, more, tmp_path / "out", progress=False, log=lambda s: None)


def test_linearize_command_refuses_a_changed_text_before_loading(tmp_path, capsys, request):
    text = tmp_path / "train.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 400)
    out = tmp_path / "out"
    argv = ["linearize", "--quick", "--stage", "1", "--text", str(text), "--out", str(out)]
    assert main(argv) == 0
    capsys.readouterr()
    assert (out / "checkpoint.pt").is_file()  # kept: a longer run resumes from it, on the same text only
    text.write_text("Entirely other words. " * 400)

    no_model = request.getfixturevalue("no_model")  # from here on, loading a model fails the test
    assert no_model is None
    assert main([*argv, "--steps", "8"]) == 2
    assert "--text" in capsys.readouterr().err
