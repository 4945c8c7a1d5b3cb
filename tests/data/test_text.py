"""Text sources: files, folders, lists, corpus names; the held-out split; clear refusals."""

import pytest
import torch

from lola.data.text import ByteTokenizer, describe, encode, load_documents, load_text, split_text, token_chunks


def test_files_folders_and_lists(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "a.txt").write_text("alpha text")
    (tmp_path / "b" / "c.md").write_text("gamma text")
    (tmp_path / "b" / "skip.bin").write_bytes(b"\x00\x01")
    docs = load_documents(str(tmp_path))
    assert [t for _, t in docs] == ["alpha text", "gamma text"]  # sorted, only text suffixes
    assert load_text([str(tmp_path / "a.txt"), str(tmp_path / "b")]) == "alpha text\n\ngamma text"
    assert describe([str(tmp_path / "a.txt"), "pydoc"]).endswith("a.txt + pydoc")
    assert load_documents("pydoc")[0][0] == "pydoc_data.topics"


def test_bad_sources_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a file"):
        load_documents(str(tmp_path / "missing"))
    (tmp_path / "bin.txt").write_bytes(b"abc\x00def")
    with pytest.raises(ValueError, match="looks binary"):
        load_documents(str(tmp_path / "bin.txt"))
    (tmp_path / "latin.txt").write_bytes(bytes(range(128, 256)) * 10)
    with pytest.raises(ValueError, match="not UTF-8"):
        load_documents(str(tmp_path / "latin.txt"))
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(ValueError, match="is empty"):
        load_documents(str(tmp_path / "empty.txt"))
    (tmp_path / "none").mkdir()
    with pytest.raises(ValueError, match="holds no"):
        load_documents(str(tmp_path / "none"))
    with pytest.raises(ValueError, match="empty"):
        load_documents([])


def test_split_and_chunks():
    text = "one two.\n\nthree four.\n\nfive six seven eight nine ten."
    train, held = split_text(text, 0.3)
    assert train + "\n\n" + held == text and held.startswith("five")  # cut at a paragraph break
    with pytest.raises(ValueError, match="heldout_fraction"):
        split_text(text, 1.0)
    ids = encode(ByteTokenizer(), "abcdefghij")
    assert token_chunks(ids, 4).tolist() == [list(b"abcd"), list(b"efgh")]
    assert token_chunks(ids, 4, max_chunks=1).shape == (1, 4)
    with pytest.raises(ValueError, match="fewer than one chunk"):
        token_chunks(ids, 11)
    assert encode(ByteTokenizer(), "hi").dtype == torch.long


def test_configs_take_one_text_source_as_a_string():
    from lola.eval.perplexity import PerplexityRun
    from lola.linearize import FinetuneConfig, LinearizeConfig

    for cls in (LinearizeConfig, FinetuneConfig, PerplexityRun):
        assert cls(text="book.txt").text == ["book.txt"]
        assert cls(text=["a.txt", "pydoc"]).text == ["a.txt", "pydoc"]
        assert cls().text is None
