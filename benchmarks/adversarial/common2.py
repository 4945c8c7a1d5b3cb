"""Builders of the second batch (``cases2_*.py``), beside those of :mod:`common`.

Hugging Face folders of tiny models (with a byte tokenizer, so that ``--model FOLDER`` runs the
real loading path), hard-linked snapshots, FIFOs, models swapped under the same name between
two runs, and commands run with lola's "loading" note taken out of stderr.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from common import patched, tiny_model
from harness import CliResult, cli

_LOADING = re.compile(r"^lola: loading .* \.\.\.$")


def cli_q(argv: list[str]) -> CliResult:
    """``harness.cli``, with the informational ``lola: loading NAME ...`` line that a model
    folder prints dropped from stderr (a note, not part of an error message)."""
    result = cli(argv)
    result.err = "\n".join(line for line in result.err.splitlines() if not _LOADING.match(line.split("\r")[-1]))
    return result


def hf_folder(path: Path, model_type: str = "llama", seed: int = 0, **overrides: Any) -> Path:
    """A Hugging Face folder (``config.json``, safetensors weights, a byte-level tokenizer of
    256 ids) holding a tiny random ``model_type`` decoder."""
    from lola.integrations.lm_eval.model import byte_tokenizer

    torch.manual_seed(seed)
    kw = dict(vocab_size=256, max_position_embeddings=1024, eos_token_id=0, pad_token_id=0, bos_token_id=None)
    kw.update(overrides)
    model = tiny_model(model_type, **kw)
    model.save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    return path


def hardlink_tree(src: Path, dst: Path) -> Path:
    """``cp -al SRC DST``: a snapshot whose files are hard links to the originals."""
    for p in sorted(src.rglob("*")):
        target = dst / p.relative_to(src)
        if p.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(p, target)
    return dst


def fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


@contextmanager
def loads(make: Callable[[], tuple[Any, Any]]) -> Iterator[None]:
    """``lola.models.load`` returns ``make()`` whatever the name (a model folder whose content
    changed, or a model scripted to fail)."""

    def load(name, **kwargs):
        return make()

    with patched("lola.models", "load", load):
        yield


def other_weights(seed: int = 1) -> Callable[[], tuple[Any, Any]]:
    """The tiny random Llama with other weights (``seed``): what ``--model`` now holds."""

    def make():
        from lola.models import tiny_random

        return tiny_random(seed=seed)

    return make


def scripted(on_generate: Callable[[int], None] | None = None, on_forward: Callable[[int], None] | None = None) -> Callable[[], tuple[Any, Any]]:
    """The tiny random Llama whose ``generate`` / ``forward`` first calls ``on_generate(n)`` /
    ``on_forward(n)`` (``n``: the call's number, from 1), e.g. to raise KeyboardInterrupt or to
    change a file while the command runs."""

    def make():
        from lola.models import tiny_random

        model, tok = tiny_random()
        counts = {"generate": 0, "forward": 0}
        if on_generate is not None:
            generate = model.generate

            def gen(*args, **kwargs):
                counts["generate"] += 1
                on_generate(counts["generate"])
                return generate(*args, **kwargs)

            model.generate = gen
        if on_forward is not None:
            forward = model.forward

            def fwd(*args, **kwargs):
                counts["forward"] += 1
                on_forward(counts["forward"])
                return forward(*args, **kwargs)

            model.forward = fwd
        return model, tok

    return make


def interrupt_after(n: int) -> Callable[[int], None]:
    """A hook raising KeyboardInterrupt (Ctrl-C) from its ``n + 1``-th call on."""

    def hook(count: int) -> None:
        if count > n:
            raise KeyboardInterrupt

    return hook


def status(code: int = 0) -> Callable[[Any, Any], None]:
    """A check: the command exited with ``code``."""

    def check(result, ctx):
        from harness import ensure

        ensure(result.status == code, f"exit {result.status}: {result!r}")

    return check
