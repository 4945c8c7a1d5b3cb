"""Hostile inputs, class 6 (inputs that should be refused): text that is not text.

A haystack or training text with NUL bytes, or that is not UTF-8, is refused naming the file
(:func:`lola.data.read_text_file`, the one reader of user text files), before a model loads.
"""

from __future__ import annotations

import pytest

from lola.cli import main

transformers = pytest.importorskip("transformers")

NOT_TEXT = {
    "nul bytes": b"needle \x00\x01\x02 haystack " * 50,
    "latin-1": "caf\xe9 cr\xe8me br\xfbl\xe9e ".encode("latin-1") * 200,
    "utf-16": "The grass is green. ".encode("utf-16") * 50,
    "png": b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8,
}


@pytest.mark.parametrize("kind", sorted(NOT_TEXT))
def test_niah_refuses_a_haystack_that_is_not_text(kind, tmp_path, capsys, no_model):
    hay = tmp_path / "hay.bin"
    hay.write_bytes(NOT_TEXT[kind])
    argv = ["niah", "--model", "tiny-random-llama", "--lengths", "400", "--samples", "1", "--haystack-file", str(hay), "--out", str(tmp_path / "r")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "hay.bin" in err and ("binary" in err or "not UTF-8" in err), err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("kind", sorted(NOT_TEXT))
def test_training_text_that_is_not_text_is_refused(kind, tmp_path):
    from lola.data import load_documents, read_text_file

    f = tmp_path / "t.txt"
    f.write_bytes(NOT_TEXT[kind])
    with pytest.raises(ValueError, match=r"t.txt.*(binary|not UTF-8)"):
        read_text_file(f)
    with pytest.raises(ValueError, match=r"t.txt.*(binary|not UTF-8)"):
        load_documents([str(f)])


@pytest.mark.parametrize("kind", sorted(NOT_TEXT))
def test_the_lm_eval_export_refuses_a_haystack_that_is_not_text(kind, tmp_path):
    from lola.integrations.lm_eval.niah import export_niah
    from lola.models import tiny_random

    hay = tmp_path / "hay.bin"
    hay.write_bytes(NOT_TEXT[kind])
    _, tok = tiny_random()
    with pytest.raises(ValueError, match=r"hay.bin.*(binary|not UTF-8)"):
        export_niah(tmp_path / "tasks", tok, lengths=[512], samples=1, haystack_file=hay)
    assert not (tmp_path / "tasks").exists()
