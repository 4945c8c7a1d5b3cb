"""``save_pretrained`` / :func:`from_pretrained` round trip of a LoLA model.

:func:`apply_lola` records the LoLA config in ``model.config.lola``; ``model.save_pretrained(dir)``
then writes it to ``config.json`` and the LoLA layers' parameters (feature maps, window factors)
into the safetensors weights beside the model's own (as ``…self_attn.lola.…``). Stock
``from_pretrained`` would load the model without LoLA (and warn about the ``lola`` tensors);
:func:`from_pretrained` loads it, re-applies LoLA with the saved config and loads those tensors.

LoRA adapters merged by a stage-2 feature-map folder are saved merged into the projections, so
a model loaded this way cannot give the stock weights back on :func:`remove_lola`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from lola.config import validation_summary
from lola.integrations.transformers.apply import apply_lola, remove_lola
from lola.integrations.transformers.attention import register_attention
from lola.integrations.transformers.merged import check_merged_projections
from lola.integrations.transformers.model_record import CONFIG_KEY, config_entry, saved_config
from lola.pretrained.model_entry import read_entry

# CONFIG_KEY, config_entry and saved_config live beside AppliedLoLA; re-exported here, where they are documented.
__all__ = ["CONFIG_KEY", "config_entry", "from_pretrained", "saved_config"]

_LOLA_KEYS = r"\.self_attn\.lola\."
"""The checkpoint keys of lola's own tensors (a regex, as transformers matches them)."""


def _lola_tensors(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError, safe_open

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{directory} has no *.safetensors weights (save the model with save_pretrained(..., safe_serialization=True))")
    out: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    if ".lola." in name:
                        out[name] = f.get_tensor(name)
                        # Trained LoLA weights are finite: a NaN would surface later as some
                        # policy's or layer's fault, far from the file that holds it.
                        t = out[name]
                        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                            raise ValueError(f"{path}: LoLA weight {name!r} holds non-finite values (inf or NaN); the saved model is damaged")
        except (SafetensorError, OSError) as e:
            raise ValueError(f"{path} cannot be read as safetensors ({e})") from None
    return out


@contextmanager
def _lola_tensors_expected(cls: Any, model_config: Any) -> Iterator[None]:
    """While it is open, the class ``cls`` resolves to for ``model_config`` declares lola's
    tensors (``…self_attn.lola.…``) to transformers as expected in a checkpoint, so that a clean
    load prints no report listing them as UNEXPECTED (they are loaded after :func:`apply_lola`).
    The class attribute is transformers' own declaration (``_keys_to_ignore_on_load_unexpected``,
    read when an instance is built) and is restored on exit."""
    mapping = getattr(cls, "_model_mapping", None)  # an Auto class: the concrete class for this config
    try:
        concrete = mapping[type(model_config)] if mapping is not None else cls
    except (KeyError, TypeError):
        concrete = None
    if not isinstance(concrete, type):
        yield  # a class we cannot resolve: the report may list lola's tensors, nothing else changes
        return
    own = "_keys_to_ignore_on_load_unexpected" in concrete.__dict__
    before = concrete.__dict__.get("_keys_to_ignore_on_load_unexpected")
    concrete._keys_to_ignore_on_load_unexpected = [*(getattr(concrete, "_keys_to_ignore_on_load_unexpected", None) or []), _LOLA_KEYS]
    try:
        yield
    finally:
        if own:
            concrete._keys_to_ignore_on_load_unexpected = before
        else:
            del concrete._keys_to_ignore_on_load_unexpected


def _check_lola_tensors(directory: Path, model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Refuse lola tensors that do not fit the parameters they load into: a shape or a kind of
    dtype (integer for a float) that ``load_state_dict`` would reject deep in torch or cast
    without a word."""
    params = dict(model.named_parameters())
    for name, t in tensors.items():
        p = params[name]
        if tuple(t.shape) != tuple(p.shape):
            raise ValueError(f"{directory}: LoLA weight {name!r} has shape {tuple(t.shape)}, the config builds {tuple(p.shape)}")
        if p.is_floating_point() and not t.is_floating_point():
            raise ValueError(f"{directory}: LoLA weight {name!r} is {t.dtype}, expected a floating-point tensor (the parameter is {p.dtype})")


def from_pretrained(path: str | os.PathLike, model_class: Any = None, **kwargs: Any) -> torch.nn.Module:
    """Load a model saved with ``save_pretrained`` after :func:`apply_lola`, with LoLA applied.

    Args:
        path: the folder ``save_pretrained`` wrote (local; nothing is downloaded).
        model_class: the transformers class to load with (default ``AutoModelForCausalLM``).
        **kwargs: passed to ``from_pretrained`` (e.g. ``dtype``).

    Returns:
        The model, patched with the saved LoLA config and its trained LoLA parameters.

    Raises:
        ValueError: the folder's ``config.json`` has no LoLA entry (a stock model: load it with
            transformers and call ``apply_lola``) or one lola does not read (an unknown key, a
            field of the wrong type); a weight of the model is missing from the folder (it
            would be initialised at random); its LoLA tensors are missing, damaged or of the
            wrong shape or kind.
    """
    from safetensors import SafetensorError, safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a saved model folder, got {path!r} ({type(path).__name__})")
    directory = Path(path)
    if not (directory / "config.json").is_file():
        raise ValueError(f"{directory} is not a saved model folder (no config.json)")
    for weights in sorted(directory.glob("*.safetensors")):  # a cut file named here, not deep in transformers
        try:
            with safe_open(str(weights), framework="pt"):
                pass
        except (SafetensorError, OSError) as e:
            raise ValueError(f"{weights} cannot be read as safetensors ({e}): the saved model is damaged") from None
    register_attention()  # a saved config may name the "lola" attention implementation
    model_config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
    entry = getattr(model_config, CONFIG_KEY, None)
    if entry is None:
        raise ValueError(f"{directory}/config.json has no LoLA entry: it holds a stock model; load it with transformers and call lola.apply_lola")
    try:
        saved = read_entry(entry)
    except ValidationError as err:
        raise ValueError(f"{directory}/config.json: its 'lola' entry {validation_summary(err)}") from None
    check_merged_projections(directory, saved)  # lora_merged is a claim about the files: checked
    cls = model_class or AutoModelForCausalLM
    kwargs.setdefault("local_files_only", True)
    kwargs.pop("output_loading_info", None)  # read here: what is missing is refused below
    with _lola_tensors_expected(cls, model_config):
        model, info = cls.from_pretrained(str(directory), config=model_config, output_loading_info=True, **kwargs)
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        # transformers initialises them at random and goes on: a damaged folder, not a model.
        raise ValueError(
            f"{directory} lacks {len(missing)} weight(s) of the model ({', '.join(missing[:3])}{', …' if len(missing) > 3 else ''}): they would be initialised at random; the folder is incomplete"
        )
    if getattr(model.config, "_attn_implementation", None) == "lola":
        model.set_attn_implementation("sdpa")  # the stock implementation apply_lola will record
    tensors = _lola_tensors(directory)
    apply_lola(model, saved.config)
    params = {name for name, _ in model.named_parameters() if ".lola." in name}
    missing, unexpected = sorted(params - set(tensors)), sorted(set(tensors) - params)
    if missing or unexpected:
        remove_lola(model)
        raise ValueError(f"the LoLA weights in {directory} do not match its config: missing {missing[:3]}, unexpected {unexpected[:3]}")
    try:
        _check_lola_tensors(directory, model, tensors)
    except ValueError:
        remove_lola(model)
        raise
    model.load_state_dict(tensors, strict=False)
    model.config.lola = config_entry(model._lola.config, lora_merged=saved.lora_merged, merged_projections=saved.merged_projections)
    return model
