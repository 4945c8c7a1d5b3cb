"""Helpers of the hostile-input tests: the records of the case tables, command refusals, files
and folders to refuse, tiny models, layers and caches, feature-map folders and fit-scorer runs.

Every builder makes something valid first, so that a test changes one thing and a refusal can
only come from that one thing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch

import lola
from lola.cli import main
from lola.eval.runner import NiahRun

# -- the records of the case tables ---------------------------------------------------------------


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


# -- commands, files and folders ------------------------------------------------------------------


def refused(capsys, argv: list[str], *fragments: str) -> str:
    """Run ``lola ARGV``: exit status 2 and exactly one stderr line holding every fragment."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"lola {argv[0]}: error: ") and err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    return err


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every plain file under ``folder`` with its bytes (to prove nothing was written over)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()}


def make_file(folder: Path, name: str, data: bytes | str = b"") -> str:
    """``folder/name`` holding ``data`` (parents created), as the string a command line gives."""
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(path)


def make_folder(folder: Path, name: str) -> str:
    (folder / name).mkdir(parents=True, exist_ok=True)
    return str(folder / name)


def dangling_link(folder: Path, name: str) -> str:
    (folder / name).symlink_to(folder / "nowhere")
    return str(folder / name)


def garbled_journal(folder: Path, name: str = "o") -> str:
    """A folder holding a garbled journal of an interrupted write (``.lola-pending.json``)."""
    make_file(folder, f"{name}/.lola-pending.json", "{cut sh")
    return str(folder / name)


def cut(path: Path, keep: float = 0.5) -> None:
    """A write killed part-way: the first ``keep`` of the file's bytes."""
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


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


# `lola niah` on the tiny random Llama, refused before the model loads or run in a few seconds
FULL_NIAH = ["niah", "--model", "tiny-random-llama", "--lengths", "400", "--samples", "2", "--methods", "full", "--max-new-tokens", "1"]
WINDOW_NIAH = ["niah", "--model", "tiny-random-llama", "--lengths", "400", "--samples", "1", "--methods", "window"]

# A valid `lola niah` run: two lengths, two samples, two methods.
RUN = NiahRun(model="tiny-random-llama", lengths=[200, 300], samples=2, methods=["full", "window"], max_new_tokens=2)


GOOD_BUDGETS = {"sparse_size_per_head": [[4, 2], [2, 0]], "uniform_sparse_size": 2, "scores": [[2.0, 1.0], [1.0, 0.0]], "power": 0.5}

# -- tiny models, layers and caches ---------------------------------------------------------------

DROP = object()
"""An override that removes a default key of :func:`tiny_model` (e.g. ``head_dim=DROP``)."""

# Every tiny transformers model of these tests: 2 layers of 4 heads of 8 (2 for keys and values), 101 tokens, 256 positions.
SMALL = dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, hidden_size=32, intermediate_size=64)
SMALL.update(vocab_size=101, max_position_embeddings=256)


def tiny_model(model_type: str, attn_implementation: str = "eager", **overrides: Any):
    """A tiny random decoder of ``model_type`` built from transformers' classes (no download)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = {k: v for k, v in {**SMALL, **overrides}.items() if v is not DROP}
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **kwargs)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation).eval()


CFG = lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=3)


def layer(cfg: lola.LoLAConfig = CFG, layer: int | None = None) -> lola.LoLAAttention:
    return lola.compose(cfg, num_heads=4, head_dim=8, num_kv_heads=2, layer=layer)


def qkv(batch: int = 2, tokens: int = 20, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.randn(batch, tokens, 4, 8, generator=torch.Generator().manual_seed(seed))
    kv = x[:, :, :2].contiguous()
    return x, kv, kv


def run_layer(attn, tokens: int = 30, batch: int = 1, state=None, mask=None, seed: int = 0):
    """``attn`` over ``tokens`` random tokens of ``batch`` rows: ``(outputs, state)``."""
    x = torch.randn(batch, tokens, attn.num_heads, attn.head_dim, generator=torch.Generator().manual_seed(seed))
    kv = x[:, :, : attn.num_kv_heads].contiguous()
    with torch.no_grad():
        return attn(x, kv, kv, state=state, padding_mask=mask)


def padded_mask(batch: int = 2, tokens: int = 30) -> torch.Tensor:
    mask = torch.ones(batch, tokens, dtype=torch.bool)
    mask[1, :3] = False  # a left-padded row: rows out of step, the per-row paths
    return mask


def tiny_lola(cfg: lola.LoLAConfig = CFG):
    """The tiny random Llama with LoLA applied."""
    from lola.integrations.transformers import apply_lola
    from lola.models import tiny_random

    model, _ = tiny_random()
    return apply_lola(model, cfg)


def ids(n: int, batch: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, 200, (batch, n), generator=torch.Generator().manual_seed(seed))


def edit_cache(folder: Path, tensors: Callable[[dict], None] | None = None, meta: Callable[[dict], None] | None = None) -> None:
    """Edit a saved cache and record the new sums, as a deliberate edit would (not damage)."""
    from safetensors.torch import load_file, save

    from lola.integrations.transformers.cache import _meta_checksum

    description = json.loads((folder / "cache.json").read_text())
    if tensors is not None:
        loaded = load_file(folder / description["tensors"])
        tensors(loaded)
        data = save(loaded)
        (folder / description["tensors"]).write_bytes(data)
        description["sha256"] = hashlib.sha256(data).hexdigest()
    if meta is not None:
        meta(description)
    description["checksum"] = _meta_checksum(description)
    (folder / "cache.json").write_text(json.dumps(description))


# -- feature-map folders --------------------------------------------------------------------------


def write_maps_with_lora(folder: Path, projection: str, seed: int) -> tuple[dict[str, torch.Tensor], object]:
    """A `lola linearize` folder for the tiny random Llama: random maps and rank-2 LoRA adapters
    of ``projection`` (``"q_proj"``, ``"k_proj"``, …) in every layer; returns ``(lora, spec)``
    for :func:`lola.pretrained.lora.merge_lora`."""
    from lola.models import tiny_random
    from lola.pretrained.folder import read_feature_maps, write_feature_maps
    from lola.pretrained.lora import LoraSpec

    maps = read_feature_maps(write_random_maps(folder.parent / f"{folder.name}-maps"))
    model, _ = tiny_random()
    g = torch.Generator().manual_seed(seed)
    lora = {}
    for i, layer in enumerate(model.model.layers):
        w = getattr(layer.self_attn, projection).weight
        lora[f"base_model.model.model.layers.{i}.self_attn.{projection}.lora_A.weight"] = torch.randn(2, w.shape[1], generator=g)
        lora[f"base_model.model.model.layers.{i}.self_attn.{projection}.lora_B.weight"] = torch.randn(w.shape[0], 2, generator=g)
    spec = LoraSpec(rank=2, alpha=4.0)
    write_feature_maps(folder, maps.tensors, maps.config, maps.geometry, lora=lora, lora_spec=spec)
    return lora, spec


def write_random_maps(folder: Path, seed: int = 0, f: int = 8, **kwargs) -> Path:
    """A valid feature-map folder for the tiny random Llama (random Hedgehog maps of size ``f``)."""
    from lola.models import tiny_random
    from lola.pretrained.folder import model_geometry, write_feature_maps

    model, _ = tiny_random()
    geometry = model_geometry(model)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for i in range(geometry["num_layers"]):
        prefix = f"model.layers.{i}.self_attn."
        for side in ("q", "k"):
            tensors[prefix + f"feature_map_{side}.mlp.layer"] = torch.randn(geometry["num_heads"], geometry["head_dim"], f, generator=g)
        tensors[prefix + "window_factors"] = torch.zeros(1, geometry["num_heads"], 1, 1)
    cfg = lola.LoLAConfig(window=8, sparse_size=0, sinks=0, schedule="tokenwise", feature_map="hedgehog", feature_dim=f, mixing="lolcats")
    write_feature_maps(folder, tensors, cfg, geometry, **kwargs)
    return folder


def rehash_maps(folder: Path) -> None:
    """Record the edited files' sums in the description, as a deliberate edit would: the
    content checks must catch what the sums no longer can."""
    path = folder / "lola_config.json"
    meta = json.loads(path.read_text())
    meta["files"] = {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in meta.get("files", {})}
    path.write_text(json.dumps(meta))


# -- lola fit-scorer runs -------------------------------------------------------------------------

# A text of about 30,000 characters: enough for two 96-token training chunks and one held out.
FIT_TEXT = " ".join(f"Line {i}: the {['red', 'green', 'blue'][i % 3]} fox number {i * 7 % 13} jumps over lazy dog {i}." for i in range(400))
OTHER_TEXT = " ".join(f"Row {i}: a {['tall', 'short', 'wide'][i % 3]} ship named {i * 5 % 11} sails past harbour {i}." for i in range(400))
SMALL_FIT = dict(model="tiny-random-llama", length=96, documents=2, heldout=1, min_distance=8, min_future=16)
FIT_ARGS = ["--length", "96", "--documents", "2", "--heldout", "1", "--min-distance", "8", "--min-future", "16"]


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


def fit_checkpoint(out: Path) -> Path:
    """The checkpoint of a stopped ``fit_scorer`` run writing ``out``: ``OUT.partial``."""
    return out.with_name(out.name + ".partial")


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
    assert fit_checkpoint(out).is_file()
    return out, spec


def resume_fit(out: Path, spec, model=None):
    from lola.models import tiny_random
    from lola.scorers.fit import fit_scorer

    fresh, tok = tiny_random()
    return fit_scorer(model if model is not None else fresh, tok, spec, out, progress=False)
