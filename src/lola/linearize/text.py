"""Offline training and held-out text: the Python reference documentation shipped with CPython.

``pydoc_data.topics`` (about 470 KB of English prose and code examples, the text behind
``help()``) is on every Python installation, so attention transfer and perplexity need no
download. Any UTF-8 file can replace it.
"""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["ByteTokenizer", "encode", "load_text", "split_text", "token_chunks"]


def load_text(path: str | Path | None = None) -> str:
    """The text of ``path`` (UTF-8), or CPython's ``pydoc_data.topics`` when ``None``."""
    if path is None:
        from pydoc_data.topics import topics

        return "\n\n".join(topics[name].strip() for name in sorted(topics))
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"text file {str(p)!r} does not exist")
    text = p.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        raise ValueError(f"text file {str(p)!r} is empty")
    return text


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

    def __call__(self, text: str, add_special_tokens: bool = True, return_tensors: str | None = None) -> "Encoding":
        ids = list(text.encode("utf-8"))
        return Encoding(input_ids=torch.tensor([ids]) if return_tensors == "pt" else ids)

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return bytes(i for i in ids if 0 < i < 256).decode("utf-8", errors="replace")
