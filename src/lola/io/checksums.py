"""sha256 of files: downloads (models, corpora), checkpoints and saved caches are checked with it;
and the fingerprints of a run's inputs, by content, so that a resumed run never mixes two inputs
that share a path."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["changed_inputs", "content_digest", "sha256_file", "tensors_digest", "weights_digest"]


def sha256_file(path: str | os.PathLike, progress: bool = False) -> str:
    """The hex sha256 of the file at ``path``, read in 1 MiB blocks (a tqdm bar with ``progress``)."""
    digest = hashlib.sha256()
    size = os.path.getsize(path)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=size, unit="B", unit_scale=True, desc=f"checking {os.path.basename(path)}", leave=False, disable=None)
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
                if bar is not None:
                    bar.update(len(block))
    finally:
        if bar is not None:
            bar.close()
    return digest.hexdigest()


def content_digest(path: str | os.PathLike) -> str:
    """The sha256 of what ``path`` holds: a file's bytes, or for a folder every file under it
    (names relative to it, sorted, with their bytes); the path itself does not count.

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    p = Path(path)
    if p.is_file():
        return sha256_file(p)
    if not p.is_dir():
        raise FileNotFoundError(f"{path} does not exist")
    digest = hashlib.sha256()
    for f in sorted(x for x in p.rglob("*") if x.is_file()):
        digest.update(f"{f.relative_to(p).as_posix()}\0{sha256_file(f)}\n".encode())
    return digest.hexdigest()


def changed_inputs(saved: Mapping[str, object] | None, current: Mapping[str, object]) -> list[str]:
    """The names whose fingerprint differs between a saved run and this one (a name the saved
    run did not record is not compared: runs from before fingerprints resume as they did)."""
    if not isinstance(saved, Mapping):
        return []
    return sorted(k for k, v in current.items() if k in saved and saved[k] != v)


WEIGHT_SAMPLES = 4096
"""Values of each tensor that :func:`weights_digest` hashes (evenly strided, the first included)."""


def weights_digest(model: Any, every_value: bool = False) -> str:
    """A fingerprint of a loaded model's weights, whatever name or path loaded them: the sha256
    of every tensor of its ``state_dict`` (LoLA layers, trained maps and adapters included when
    they are in the model), by name and shape and

    - ``every_value=False``: ``WEIGHT_SAMPLES`` evenly strided values of each, as float64 (cheap
      even for billions of parameters; the same weights in bfloat16 or float32, on any device,
      have one fingerprint). Resumes record it (``model``) and refuse one that differs, so that
      samples or training steps of two models never mix under one run; taken before LoLA or
      adapters modify the model.
    - ``every_value=True``: every byte, with the dtype: a saved :class:`~lola.LoLACache` is refused
      by a model whose weights or maps differ in any value.
    """
    return tensors_digest(model.state_dict().items(), every_value)


def tensors_digest(tensors: Iterable[tuple[str, Any]], every_value: bool = False) -> str:
    """:func:`weights_digest` of named tensors (``(name, tensor)`` pairs, in any order): what a
    saved model folder records of a part of its weights (the LoRA-merged projections) so that
    a loader can check the files hold what the folder's metadata says they do."""
    import torch

    digest = hashlib.sha256()
    with torch.no_grad():
        for name, tensor in sorted(tensors, key=lambda item: item[0]):
            header = f"{name}\0{tuple(tensor.shape)}" + (f"\0{tensor.dtype}" if every_value else "")
            digest.update(f"{header}\n".encode())
            if tensor.device.type == "meta" or tensor.numel() == 0:
                continue
            flat = tensor.detach().reshape(-1)
            if every_value:
                digest.update(flat.to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
                continue
            step = max(1, flat.numel() // WEIGHT_SAMPLES)
            sample = flat[::step][:WEIGHT_SAMPLES].to("cpu")
            # as float64 (exact for every float and int dtype up to 2**53): the same weights loaded
            # in bfloat16 or float32 (on the GPU or the CPU) have one fingerprint
            digest.update(sample.to(torch.float64).contiguous().numpy().tobytes())
    return digest.hexdigest()
