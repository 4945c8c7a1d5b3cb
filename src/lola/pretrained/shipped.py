"""Linearized feature maps (and LoRA adapters) that ship inside the lola package.

``apply_lola(model, cfg, feature_maps="smollm2-135m-instruct")``, ``lola niah --feature-maps
smollm2-135m-instruct`` and ``lola.models.load("smollm2-135m-instruct", linearized=True)`` read
the folder ``lola/pretrained/shipped/<name>/`` (written by ``lola linearize``, packed by :func:`pack`). Every file's sha256 is checked before it is read: a damaged installation is an
error, never a silently different model.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from lola.errors import UnknownName

__all__ = ["SHIPPED", "SHIPPED_FILES", "ShippedMaps", "pack", "resolve_feature_maps", "shipped_folder"]

SHIPPED_FILES = ("feature_maps.safetensors", "lora.safetensors", "lola_config.json", "report.json", "finetune_report.json")


@dataclass(frozen=True)
class ShippedMaps:
    """A feature-map folder shipped with lola.

    Attributes:
        model: the registered model (:data:`lola.models.REGISTRY`) it was trained for.
        files: ``{file name: sha256}`` of the folder's files.
        summary: one line on how it was trained (the folder's reports hold the details).
    """

    model: str
    files: dict[str, str]
    summary: str


SHIPPED: dict[str, ShippedMaps] = {
    "smollm2-135m-instruct": ShippedMaps(
        model="smollm2-135m-instruct",
        files={
            "feature_maps.safetensors": "adbe355514ede48efe7f4f29785ec6071b07995658a37a42b555c12939b6a98d",
            "lora.safetensors": "e883747fd9f4e9df2732de47553d5bf8804a6c71166145fcdee97e9eb8146afe",
            "lola_config.json": "5b07a86ce7aa3f047b42f6a843cf4ae1d6e7786e3e7c4aa37f3fa02520966458",
            "report.json": "9126db6bbfd0c46557a52cf3e3b089b72af6dabba0a4c40e37bc6c90f3491a09",
            "finetune_report.json": "00359637689d2f40af46b94042ffaf8c15975d88c74a84b2522d09f17fdde1d4",
        },
        summary=(
            "LoLCATs' two stages (`lola linearize --model smollm2-135m-instruct --steps 150 --train-chunks 16 --checkpoint-every 10 --stage2-steps 120`: "
            "stage 1 on 32,768 tokens, stage 2 on 245,760 tokens at 2,048), then 20 more stage-2 steps through LoLA as `lola niah` runs it "
            "(`lola linearize --stage 2 --feature-maps FOLDER --from-lora --stage2-attention lola --stage2-steps 20 --warmup-steps 2 --lora-lr 5e-4 "
            "--maps-lr 5e-4`: 40,960 tokens); two CPU cores, 8.5 + 38.5 + 46.6 minutes of training; hedgehog_identity maps, window 64, "
            "the bare hybrid's rule lolcats, LoRA rank 8 on q, k, v, o; tensors in float32 (the weights that were measured)"
        ),
    ),
}
SHIPPED_ROOT = Path(__file__).parent / "shipped"


def shipped_folder(name: str) -> Path:
    """The verified folder of the shipped maps ``name``.

    Raises:
        KeyError: not a shipped name.
        RuntimeError: a file is missing or its sha256 differs (a damaged installation).
    """
    if name not in SHIPPED:
        raise UnknownName(f"no shipped feature maps named {name!r}; shipped: {', '.join(sorted(SHIPPED)) or 'none'}")
    folder = SHIPPED_ROOT / name
    for file, digest in SHIPPED[name].files.items():
        path = folder / file
        if not path.is_file():
            raise RuntimeError(f"the shipped feature maps {name!r} lack {path}; reinstall lola")
        got = _sha256(path)
        if got != digest:
            raise RuntimeError(f"{path} has sha256 {got}, expected {digest}; reinstall lola (not loading a damaged file)")
    return folder


_DIGESTS: dict[tuple, str] = {}


def _sha256(path: Path) -> str:
    """The file's sha256, hashed again only when the file changed (its inode, size or
    modification and change times): a run asks for the shipped folder once per method and lookup."""
    st = path.stat()
    key = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)  # (ctime: no tool sets it back)
    found = _DIGESTS.get(key)
    if found is None:
        found = _DIGESTS[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def resolve_feature_maps(name_or_path: str | os.PathLike) -> Path:
    """A shipped name's verified folder, or the path itself."""
    key = os.fspath(name_or_path)
    if key in SHIPPED:
        return shipped_folder(key)
    return Path(key).expanduser()


def pack(folder: str | os.PathLike, out: str | os.PathLike, dtype: str = "bfloat16") -> dict[str, str]:
    """Copy a ``lola linearize`` folder into ``out`` as it ships: tensors in ``dtype``
    (``"bfloat16"``, half the bytes, or ``"float32"``, the very weights that were measured), the
    configuration and reports as they are, no checkpoints.

    Returns:
        ``{file name: sha256}``, the ``files`` of a :class:`ShippedMaps` entry.
    """
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    if dtype not in ("bfloat16", "float32"):
        raise ValueError(f"dtype must be 'bfloat16' or 'float32', got {dtype!r}")
    src, dst = Path(folder), Path(out)
    dst.mkdir(parents=True, exist_ok=True)
    files = {}
    for name in SHIPPED_FILES:
        if not (src / name).is_file():
            continue
        if name.endswith(".safetensors"):
            save_file({k: v.to(getattr(torch, dtype)).contiguous() for k, v in load_file(str(src / name)).items()}, str(dst / name))
        elif name == "lola_config.json":
            meta = json.loads((src / name).read_text())
            meta.pop("files", None)  # the tensors change dtype here; the registry's sums check the shipped files
            (dst / name).write_text(json.dumps(meta, indent=2) + "\n")
        else:
            shutil.copyfile(src / name, dst / name)
        files[name] = hashlib.sha256((dst / name).read_bytes()).hexdigest()
    if "feature_maps.safetensors" not in files:
        raise FileNotFoundError(f"{src} holds no feature_maps.safetensors: not a `lola linearize` folder")
    return files
