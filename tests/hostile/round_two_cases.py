"""Shared pieces of the second hostile-input round (tests/hostile/test_round_two.py): the case
records, the tiny inputs every case starts from, and the edits that damage them.

Every builder here makes something valid first (a fit-scorer checkpoint, a saved cache, a saved
model, a scorer file, a used state) so that a case changes one thing and a refusal can only come
from that one thing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch

import lola

# A text of about 30,000 characters: enough for two 96-token training chunks and one held out.
FIT_TEXT = " ".join(f"Line {i}: the {['red', 'green', 'blue'][i % 3]} fox number {i * 7 % 13} jumps over lazy dog {i}." for i in range(400))
OTHER_TEXT = " ".join(f"Row {i}: a {['tall', 'short', 'wide'][i % 3]} ship named {i * 5 % 11} sails past harbour {i}." for i in range(400))
SMALL_FIT = dict(model="tiny-random-llama", length=96, documents=2, heldout=1, min_distance=8, min_future=16)
FIT_ARGS = ["--length", "96", "--documents", "2", "--heldout", "1", "--min-distance", "8", "--min-future", "16"]

CFG = lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=3)


@dataclass(frozen=True)
class Case:
    """One hostile input given to the Python API.

    Attributes:
        id: what the input is.
        run: ``run(tmp_path)`` consumes the input (and builds whatever valid things it needs).
        error: the exception type(s) a clear refusal raises.
        match: a regular expression the message must hold: it names the input and what was
            expected.
        gap: ``None`` when the library refuses it clearly; else why it does not yet and what
            would fix it (the case is then a strict xfail).
    """

    id: str
    run: Callable[[Path], Any]
    error: type[BaseException] | tuple[type[BaseException], ...]
    match: str
    gap: str | None = None


@dataclass(frozen=True)
class Command:
    """One hostile ``lola`` command line.

    Attributes:
        id: what the input is.
        argv: ``argv(tmp_path)`` builds the command line (and whatever files it names).
        fragments: what the one ``lola CMD: error:`` line must hold.
        before_load: the refusal must come before any model is loaded.
        gap: as :attr:`Case.gap`.
    """

    id: str
    argv: Callable[[Path], list[str]]
    fragments: tuple[str, ...]
    before_load: bool = True
    gap: str | None = None


def params(cases: list) -> list:
    """``cases`` as pytest parameters; a case with a ``gap`` is a strict xfail giving it."""
    return [pytest.param(c, id=c.id, marks=[pytest.mark.xfail(strict=True, reason=c.gap)] if c.gap else []) for c in cases]


# -- fit-scorer checkpoints ------------------------------------------------------------------------


def text_file(folder: Path, name: str = "text.txt", text: str = FIT_TEXT) -> Path:
    """``folder/name`` holding ``text``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


def fit_spec(text: Path | list, **changes):
    """The small fit every resume case starts from (2 chunks of 96 tokens), on ``text``."""
    from lola.scorers.fit import FitSpec

    sources = [str(t) for t in text] if isinstance(text, list) else [str(text)]
    return FitSpec(**{**SMALL_FIT, "text": sources, **changes})


def interrupted_fit(tmp_path: Path, spec=None, model=None) -> tuple[Path, Any]:
    """A ``fit_scorer`` run stopped (as by Ctrl-C) after its first chunk: ``(out, spec)``, with
    ``out.partial`` holding the statistics of one chunk."""
    import lola.scorers.fit as fit
    from lola.models import tiny_random

    spec = spec if spec is not None else fit_spec(text_file(tmp_path))
    out = tmp_path / "s.safetensors"
    real = fit._save_checkpoint

    def stop(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt

    with mock.patch.object(fit, "_save_checkpoint", stop), pytest.raises(KeyboardInterrupt):
        fit.fit_scorer(model if model is not None else tiny_random()[0], tiny_random()[1], spec, out, progress=False)
    assert out.with_name(out.name + ".partial").is_file()
    return out, spec


def resume_fit(out: Path, spec, model=None):
    from lola.models import tiny_random
    from lola.scorers.fit import fit_scorer

    fresh, tok = tiny_random()
    return fit_scorer(model if model is not None else fresh, tok, spec, out, progress=False)


def edit_safetensors(path: Path, tensors: Callable[[dict], None] | None = None, meta: Callable[[dict], None] | None = None) -> None:
    """Rewrite a safetensors file with its tensors and metadata edited."""
    from safetensors import safe_open
    from safetensors.torch import save

    with safe_open(str(path), framework="pt") as f:
        metadata = dict(f.metadata() or {})
        loaded = {k: f.get_tensor(k) for k in f.keys()}
    if tensors is not None:
        tensors(loaded)
    if meta is not None:
        meta(metadata)
    path.write_bytes(save(loaded, metadata=metadata))


def cut(path: Path, keep: float = 0.5) -> None:
    """A write killed part-way: the first ``keep`` of the file's bytes."""
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


# -- states, caches, saved models, scorers -------------------------------------------------------------


def layer(cfg: lola.LoLAConfig = CFG, layer: int | None = None) -> lola.LoLAAttention:
    return lola.compose(cfg, num_heads=4, head_dim=8, num_kv_heads=2, layer=layer)


def qkv(batch: int = 2, tokens: int = 20, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.randn(batch, tokens, 4, 8, generator=torch.Generator().manual_seed(seed))
    kv = x[:, :, :2].contiguous()
    return x, kv, kv


def used_state(batch: int = 2, cfg: lola.LoLAConfig = CFG):
    """A layer and the state it reached after 20 tokens of ``batch`` rows."""
    attn = layer(cfg)
    with torch.no_grad():
        _, state = attn(*qkv(batch), state=attn.new_state())
    return attn, state


def tiny_lola(cfg: lola.LoLAConfig = CFG):
    from lola.integrations.transformers import apply_lola
    from lola.models import tiny_random

    model, tok = tiny_random()
    return apply_lola(model, cfg), tok


def ids(n: int, batch: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, 200, (batch, n), generator=torch.Generator().manual_seed(seed))


def saved_cache(folder: Path, cfg: lola.LoLAConfig = CFG):
    """A LoLA model and the cache of 30 tokens it saved to ``folder``."""
    from lola.integrations.transformers import LoLACache

    model, _ = tiny_lola(cfg)
    cache = LoLACache(model)
    with torch.no_grad():
        model(ids(30), cache=cache)
    cache.save(folder)
    return model


def saved_model(folder: Path, cfg: lola.LoLAConfig | None = None) -> Path:
    """A tiny LoLA model saved with ``save_pretrained`` (trainable Hedgehog maps: LoLA weights)."""
    model, _ = tiny_lola(cfg or lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=3, feature_map="hedgehog", feature_dim=8))
    model.save_pretrained(folder)
    return folder


def edit_model_config(folder: Path, change: Callable[[dict], None]) -> None:
    data = json.loads((folder / "config.json").read_text())
    change(data)
    (folder / "config.json").write_text(json.dumps(data))


def edit_model_tensors(folder: Path, change: Callable[[dict], None]) -> None:
    from safetensors.torch import load_file, save_file

    (path,) = folder.glob("*.safetensors")
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def lola_weight(tensors: dict) -> str:
    """The name of a LoLA weight among a saved model's tensors."""
    return sorted(k for k in tensors if ".lola." in k and tensors[k].is_floating_point())[0]


def scorer_file(folder: Path, layers: int = 2, kv_heads: int = 2, head_dim: int = 8, **tensors) -> Path:
    """A valid token scorer file (zeros), with ``tensors`` replacing or adding entries."""
    from safetensors.torch import save

    from lola.scorers import FORMAT

    folder.mkdir(parents=True, exist_ok=True)
    body = {"weight": torch.zeros(layers, kv_heads, 2 * head_dim + 1), "inv_freq": torch.ones(head_dim // 2)}
    body.update(tensors)
    metadata = {"format": FORMAT, "info": json.dumps({"model": "tiny"})}
    path = folder / "scorer.safetensors"
    path.write_bytes(save({k: v for k, v in body.items() if v is not None}, metadata=metadata))
    return path


def scorer_info(folder: Path, info: str) -> Path:
    """A valid scorer file whose ``info`` metadata is ``info``."""
    path = scorer_file(folder)
    edit_safetensors(path, meta=lambda m: m.update(info=info))
    return path


def budgets_file(folder: Path, data: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "b.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


GOOD_BUDGETS = {"sparse_size_per_head": [[4, 2], [2, 0]], "uniform_sparse_size": 2, "scores": [[2.0, 1.0], [1.0, 0.0]], "power": 0.5}


def maps_folder(folder: Path) -> Path:
    from tests.hostile.common import write_random_maps

    write_random_maps(folder)
    return folder


def plugin_policy(name: str, score: Callable[[Any], Any]):
    """Register a plug-in policy ``name`` whose ``score`` answers ``score(candidates)``."""
    from lola.policies import register

    class Scorer:
        needs_attention = False

        def score(self, candidates, ctx):
            return score(candidates)

    register(name, Scorer, overwrite=True)
    return name


def run_policy(name: str) -> None:
    """A layer with the policy ``name`` over 20 tokens (several select steps)."""
    from lola.policies import unregister

    try:
        attn = layer(lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=3, policy=name))
        with torch.no_grad():
            attn(*qkv(1))
    finally:
        unregister(name)
