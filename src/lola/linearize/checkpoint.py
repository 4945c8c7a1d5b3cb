"""Resumable training: an atomic checkpoint write, and a read that refuses what does not match.

Both stages of ``lola linearize`` checkpoint their trainable tensors, optimizer, schedule and
losses; a later run with the same ``--out`` and options resumes. A checkpoint written with other
options, for a model of another shape, beyond the steps now asked for, or on other content (the
text; for stage 2 also the stage-1 maps it started from, :func:`run_inputs`) is refused with a
message that says which.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

from lola.io.checksums import (
    changed_inputs,
    sha256_file,
    weights_digest,  # noqa: F401  (re-exported: the fingerprint resumes record)
)
from lola.io.outputs import write_files

__all__ = ["checksum_path", "load_checkpoint", "read_checkpoint", "run_inputs", "stage1_digest", "write_checkpoint"]


def checksum_path(path: Path) -> Path:
    """Where the sha256 of checkpoint ``path`` is kept (``checkpoint.pt.sha256``)."""
    return path.with_name(path.name + ".sha256")


def write_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write the checkpoint and its sha256 (``checkpoint.pt.sha256``, checked on every read)
    with :func:`lola.io.outputs.write_files`: a crash mid-write never leaves a broken checkpoint,
    and neither file is written through a link."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    write_files(path.parent, {path.name: data, checksum_path(path).name: hashlib.sha256(data).hexdigest() + "\n"}, writer="lola linearize")


def load_checkpoint(path: Path, cfg: BaseModel, steps_option: str, inputs: dict[str, str] | None = None) -> dict[str, Any]:
    """The state saved at ``path``, checked against this run's options (not yet the model).

    Cheap enough to run before the model is loaded, so that a damaged or mismatched checkpoint
    is refused up front.

    Args:
        inputs: this run's fingerprints (default ``run_inputs(cfg)``: the text alone; stage 2
            passes the stage-1 maps' too, see :func:`run_inputs`).

    Raises:
        ValueError: an unreadable file (named), other options, more steps done than asked for,
            or other content (the text, or stage-1 maps retrained since stage 2 started).
    """
    from lola.io.outputs import check_regular_file, finish_pending

    finish_pending(path.parent)  # a checkpoint write that a kill cut short: completed first
    sums = checksum_path(path)
    check_regular_file(path, "a lola linearize checkpoint")  # a FIFO would block the read
    if sums.exists() or sums.is_symlink():
        check_regular_file(sums, "the checkpoint's sha256 (a text file)")
    if sums.exists() and sums.read_text().strip() != sha256_file(path):
        raise ValueError(f"{path} does not match its checksum in {sums.name}: the file is damaged; delete both to start afresh")
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
        saved = type(cfg).model_validate(state["config"])
    except Exception as err:  # truncated, foreign or hand-edited files
        raise ValueError(f"{path} is not a readable checkpoint ({type(err).__name__}: {err}); delete it to start afresh") from None
    inputs = run_inputs(cfg) if inputs is None else inputs
    same = {"steps": cfg.steps}
    saved_inputs = state.get("inputs")
    if isinstance(saved_inputs, dict) and "text" in inputs and saved_inputs.get("text") == inputs["text"]:
        same["text"] = cfg.text  # the same content under another path (runs fingerprint content, not paths)
    if saved.model_copy(update=same) != cfg:
        diff = {k: (v, getattr(cfg, k)) for k, v in saved.model_dump().items() if k not in same and v != getattr(cfg, k)}
        raise ValueError(f"{path} was written by a run with other options {diff} (saved, requested); use another --out or the same options")
    try:
        step = int(state["step"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{path} is not a readable checkpoint (no step count); delete it to start afresh") from None
    if step > cfg.steps:
        raise ValueError(f"{path} is at step {step}, beyond {steps_option} {cfg.steps}; ask for at least {step} steps")
    changed = changed_inputs(saved_inputs, inputs)
    if "feature_maps" in changed:
        raise ValueError(
            f"{path} continues stage 2 from other stage-1 feature maps than those it now starts from (stage 1 retrained since, or another --feature-maps); "
            f"delete {path.name} and {checksum_path(path).name} to start stage 2 afresh from the new maps, or use another --out"
        )
    if "model" in changed:
        raise ValueError(
            f"{path} was written by a run on other model weights: --model now loads weights that differ from those training started from; "
            "use the same model, or another --out"
        )
    if changed:
        raise ValueError(
            f"{path} was written by a run on other content: --{changed[0]} {getattr(cfg, changed[0])!r} changed since (same path, other content); "
            "restore it, or use another --out"
        )
    return state


def run_inputs(cfg: BaseModel, stage1_maps: str | Path | None = None, model: Any = None) -> dict[str, str]:
    """The fingerprints of what a training run reads besides its options: its text, by content
    (:func:`lola.data.text.source_digest`), for stage 2 the stage-1 feature maps it starts from
    (``stage1_maps``, see :func:`stage1_digest`), and the teacher's weights once it is loaded
    (``model``, :func:`weights_digest`). Saved in every checkpoint; a resume must match."""
    from lola.data.text import source_digest

    inputs = {"text": source_digest(getattr(cfg, "text", None))}
    if model is not None:
        inputs["model"] = weights_digest(model)
    if stage1_maps is not None:
        digest = stage1_digest(stage1_maps)
        if digest is not None:
            inputs["feature_maps"] = digest
    return inputs


def stage1_digest(folder: str | Path) -> str | None:
    """The fingerprint (:func:`lola.io.checksums.content_digest`) of the stage-1 maps that stage 2
    starts from in ``folder``.

    A folder of stage 1 holds them: the digest of its ``feature_maps.safetensors``. Once stage 2
    has written its own maps there (a folder with LoRA weights), the stage-1 maps are gone, and
    the digest is the one that stage 2 recorded in ``finetune_report.json`` (``inputs``), or
    ``None`` if it recorded none (then nothing is compared). Retraining stage 1 into the folder
    removes the LoRA weights and that report, so the new maps are fingerprinted afresh.
    """
    import json

    from lola.io.checksums import content_digest
    from lola.pretrained.folder import FEATURE_MAPS_FILE, FINETUNE_REPORT_FILE
    from lola.pretrained.lora import LORA_FILE

    folder = Path(folder)
    if not (folder / LORA_FILE).is_file():
        return content_digest(folder / FEATURE_MAPS_FILE)
    try:
        recorded = json.loads((folder / FINETUNE_REPORT_FILE).read_text())["inputs"]["feature_maps"]
    except (OSError, ValueError, KeyError, TypeError):  # written before the fingerprint existed
        return None
    return recorded if isinstance(recorded, str) else None


def read_checkpoint(path: Path, cfg: BaseModel, geometry: dict, steps_option: str, inputs: dict[str, str] | None = None) -> dict[str, Any]:
    """The state saved at ``path``, checked against this run.

    Args:
        path: the checkpoint file (read with ``weights_only=True``: data, never code).
        cfg: this run's options; the saved ones must be equal except ``steps``.
        geometry: this model's geometry; the saved one must be equal.
        steps_option: the command-line option of ``steps``, for the message.
        inputs: this run's fingerprints (see :func:`load_checkpoint`).

    Raises:
        ValueError: other options or content, another model, more steps done than asked for,
            or an unreadable file (named).
    """
    state = load_checkpoint(path, cfg, steps_option, inputs)
    if state.get("geometry", geometry) != geometry:
        raise ValueError(f"{path} was written for another model (geometry {state['geometry']}, this model {geometry})")
    return state
