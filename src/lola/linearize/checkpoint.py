"""Resumable training: an atomic checkpoint write, and a read that refuses what does not match.

Both stages of ``lola linearize`` checkpoint their trainable tensors, optimizer, schedule and
losses; a later run with the same ``--out`` and options resumes. A checkpoint written with other
options, for a model of another shape, or beyond the steps now asked for is refused with a
message that says which.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

from lola.checksums import changed_inputs, sha256_file
from lola.outputs import write_files

__all__ = ["checksum_path", "load_checkpoint", "read_checkpoint", "run_inputs", "write_checkpoint"]


def checksum_path(path: Path) -> Path:
    """Where the sha256 of checkpoint ``path`` is kept (``checkpoint.pt.sha256``)."""
    return path.with_name(path.name + ".sha256")


def write_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write the checkpoint and its sha256 (``checkpoint.pt.sha256``, checked on every read)
    with :func:`lola.outputs.write_files`: a crash mid-write never leaves a broken checkpoint,
    and neither file is written through a link."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    write_files(path.parent, {path.name: data, checksum_path(path).name: hashlib.sha256(data).hexdigest() + "\n"}, writer="lola linearize")


def load_checkpoint(path: Path, cfg: BaseModel, steps_option: str) -> dict[str, Any]:
    """The state saved at ``path``, checked against this run's options (not yet the model).

    Cheap enough to run before the model is loaded, so that a damaged or mismatched checkpoint
    is refused up front.

    Raises:
        ValueError: an unreadable file (named), other options, or more steps done than asked for.
    """
    sums = checksum_path(path)
    if sums.exists() and sums.read_text().strip() != sha256_file(path):
        raise ValueError(f"{path} does not match its checksum in {sums.name}: the file is damaged; delete both to start afresh")
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
        saved = type(cfg).model_validate(state["config"])
    except Exception as err:  # truncated, foreign or hand-edited files
        raise ValueError(f"{path} is not a readable checkpoint ({type(err).__name__}: {err}); delete it to start afresh") from None
    if saved.model_copy(update={"steps": cfg.steps}) != cfg:
        diff = {k: (v, getattr(cfg, k)) for k, v in saved.model_dump().items() if k != "steps" and v != getattr(cfg, k)}
        raise ValueError(f"{path} was written by a run with other options {diff} (saved, requested); use another --out or the same options")
    try:
        step = int(state["step"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{path} is not a readable checkpoint (no step count); delete it to start afresh") from None
    if step > cfg.steps:
        raise ValueError(f"{path} is at step {step}, beyond {steps_option} {cfg.steps}; ask for at least {step} steps")
    changed = changed_inputs(state.get("inputs"), run_inputs(cfg))
    if changed:
        raise ValueError(
            f"{path} was written by a run on other content: --{changed[0]} {getattr(cfg, changed[0])!r} changed since (same path, other content); "
            "restore it, or use another --out"
        )
    return state


def run_inputs(cfg: BaseModel) -> dict[str, str]:
    """The fingerprints of what a training run reads besides its options: its text, by content
    (:func:`lola.data.source_digest`). Saved in every checkpoint; a resume must match."""
    from lola.data import source_digest

    return {"text": source_digest(getattr(cfg, "text", None))}


def read_checkpoint(path: Path, cfg: BaseModel, geometry: dict, steps_option: str) -> dict[str, Any]:
    """The state saved at ``path``, checked against this run.

    Args:
        path: the checkpoint file (read with ``weights_only=True``: data, never code).
        cfg: this run's options; the saved ones must be equal except ``steps``.
        geometry: this model's geometry; the saved one must be equal.
        steps_option: the command-line option of ``steps``, for the message.

    Raises:
        ValueError: other options, another model, more steps done than asked for, or an
            unreadable file (named).
    """
    state = load_checkpoint(path, cfg, steps_option)
    if state.get("geometry", geometry) != geometry:
        raise ValueError(f"{path} was written for another model (geometry {state['geometry']}, this model {geometry})")
    return state
