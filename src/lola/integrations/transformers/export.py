"""Write a model with LoLA applied as a Hugging Face folder: :func:`export_pretrained`
(``lola export``).

The folder is what ``save_pretrained`` writes after :func:`apply_lola` (the weights with any
LoRA adapters merged, the LoLA layers' trained parameters as ``…self_attn.lola.…`` tensors,
``config.json`` with the ``lola`` entry of :mod:`lola.pretrained.model_entry`) and the tokenizer.
:func:`lola.from_pretrained` loads it with LoLA applied; with ``vllm=True`` its
``config.json`` also names the ``lola-attention-vllm`` plug-in's architecture, so that ``vllm serve
FOLDER`` serves it (see the serving guide).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from lola.config import LoLAConfig
from lola.limits import MAX_TOKENS
from lola.pretrained.model_entry import CONFIG_KEY, ENTRY_FORMAT

__all__ = ["VLLM_ARCHITECTURE", "check_export_folder", "export_pretrained", "is_exported_folder"]

VLLM_ARCHITECTURE = "LoLALlamaForCausalLM"
"""The architecture the ``lola-attention-vllm`` plug-in registers (``config.json``'s ``architectures``)."""

BOUNDED_MAX_LENGTH = MAX_TOKENS
"""``model_max_length`` of a vLLM export with bounded positions: vLLM refuses a ``max_model_len``
past ``max_position_embeddings`` unless the config names a longer one, and a LoLA layer with
bounded positions reads any length with positions the model was trained on."""

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def is_exported_folder(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds a saved LoLA model (a ``config.json`` with lola's entry): its
    files may be replaced by a new export; any other folder's files are refused."""
    config = Path(folder) / "config.json"
    try:
        entry = json.loads(config.read_text()).get(CONFIG_KEY)
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(entry, dict) and entry.get("format") == ENTRY_FORMAT


def check_export_folder(out: str | os.PathLike, option: str = "out") -> Path:
    """Refuse an output folder an export may not write: one that cannot be written, or that
    holds files and was not written by an export (:func:`is_exported_folder`). Nothing is
    created. Returns the folder as a path.

    Raises:
        ValueError: naming ``option`` and the folder.
    """
    from lola.io.outputs import check_output_folder

    folder = check_output_folder(out, option)
    if folder.is_dir() and any(folder.iterdir()) and not is_exported_folder(folder):
        raise ValueError(f"{option} {folder} holds files that lola export did not write; give an empty or new folder")
    return folder


def export_pretrained(
    model: torch.nn.Module,
    tokenizer: Any,
    out: str | os.PathLike,
    config: LoLAConfig | None = None,
    feature_maps: Any = None,
    *,
    dtype: str = "float32",
    vllm: bool = False,
) -> list[Path]:
    """Write ``model`` with LoLA applied (``config``, ``feature_maps``) as a Hugging Face folder.

    ``model`` itself is not changed: a plain copy of its weights is made (a GGUF-loaded model
    cannot be saved by transformers), LoLA is applied to the copy, LoRA adapters are merged in
    float32, and only then are the weights cast to ``dtype``. Every file goes through
    :func:`lola.io.outputs.write_files` (atomic, all or nothing, ``config.json`` last).

    Args:
        model: a stock transformers causal LM (LoLA not applied).
        tokenizer: saved beside the weights when it has ``save_pretrained``, else left out.
        out: the folder to write: new, empty, or written by an export
            (:func:`check_export_folder`); the files of an earlier export are replaced.
        config: the LoLA config (default :class:`~lola.LoLAConfig`'s); an unset mixing rule is
            decided by :mod:`lola.pretrained.resolve`, and the rule that will run is what is saved.
        feature_maps: a ``lola linearize`` folder or shipped name (see :func:`apply_lola`).
        dtype: ``"float32"`` (default: the very weights lola computes with), ``"bfloat16"`` or
            ``"float16"``.
        vllm: name the ``lola-attention-vllm`` architecture in ``config.json`` (:data:`VLLM_ARCHITECTURE`).

    Returns:
        The paths written.

    Raises:
        ValueError: ``model`` already has LoLA applied, a ``dtype`` not listed, or an ``out``
            that cannot be written or holds another program's files.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    from lola.integrations.transformers.apply import apply_lola
    from lola.integrations.transformers.model_record import applied
    from lola.io.outputs import write_files

    if type(vllm) is not bool:  # "false" is a true value: it would write the vLLM architecture
        raise TypeError(f"vllm must be True or False, got {vllm!r}")
    if applied(model) is not None:
        raise ValueError("export_pretrained applies LoLA itself: give it the stock model (call lola.remove_lola(model) first)")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    out = check_export_folder(out)
    fields = model.config.to_dict()
    fields.pop("quantization_config", None)  # dequantised weights are saved as plain tensors
    weights = model.state_dict()
    plain = AutoModelForCausalLM.from_config(AutoConfig.for_model(**fields), dtype=next(iter(weights.values())).dtype)
    plain.load_state_dict(weights)
    apply_lola(plain, config if config is not None else LoLAConfig(), feature_maps=feature_maps)
    bounded = plain._lola.config.positions == "bounded"
    if vllm:
        check_vllm_schedule(plain._lola.config)
    plain.to(_DTYPES[dtype])
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".lola-export-", dir=out) as tmp:
        plain.save_pretrained(tmp, safe_serialization=True)
        if hasattr(tokenizer, "save_pretrained"):
            tokenizer.save_pretrained(tmp)
        if vllm:  # save_pretrained writes the class it saves from: the plug-in's is named afterwards
            saved = Path(tmp) / "config.json"
            fields = {**json.loads(saved.read_text()), "architectures": [VLLM_ARCHITECTURE]}
            if bounded:  # vLLM accepts a max_model_len up to this past max_position_embeddings
                fields["model_max_length"] = BOUNDED_MAX_LENGTH
            saved.write_text(json.dumps(fields, indent=2) + "\n")
        names = sorted(p.name for p in Path(tmp).iterdir() if p.is_file())
        names.sort(key=lambda name: name == "config.json")  # the file that makes the folder a model: last
        files = {name: (lambda dst, src=Path(tmp) / name: shutil.copyfile(src, dst)) for name in names}
        return write_files(out, files, writer="lola export")  # the folder as a whole was checked above


def check_vllm_schedule(config: LoLAConfig) -> None:
    """Refuse a schedule that steps less often in a prefill (``prefill_chunk``) for vLLM: its
    pages hold the window of the decode chunk, so the plug-in would step every chunk and the
    option would do nothing.

    Raises:
        ValueError: naming the option.
    """
    prefill = config.schedule_kwargs.get("prefill_chunk")
    if prefill is not None and prefill != config.chunk:
        raise ValueError(
            f"schedule_kwargs prefill_chunk={prefill}: the vLLM plug-in steps every chunk ({config.chunk}) in prefill too "
            "(its pages hold the window of one chunk); export for vLLM without prefill_chunk"
        )
