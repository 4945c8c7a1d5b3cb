"""LoRA weights of a linearized model: names, merging into the base weights, and undoing it.

Stage 2 of ``lola linearize`` trains low-rank adapters with ``peft``; the folder keeps them as
``lora.safetensors`` with peft's names (``model.layers.{i}.self_attn.q_proj.lora_A.weight``
``[r, in]`` and ``….lora_B.weight`` ``[out, r]``). At inference no peft is needed: each adapted
projection's weight becomes ``W + (alpha / r) · B A`` (merged once by :func:`merge_lora`), and the
original tensors are kept so that :func:`restore_weights` puts the stock model back bit for bit.
"""

from __future__ import annotations

import re

import torch
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt

from lola.pretrained.tensors import group_tensors

__all__ = ["LORA_FILE", "LoraSpec", "merge_lora", "restore_weights"]

LORA_FILE = "lora.safetensors"
_KEY = re.compile(r"^(?:.*?\.)?(layers\.\d+\.self_attn\.(?:q_proj|k_proj|v_proj|o_proj))\.lora_([AB])\.weight$")


class LoraSpec(BaseModel):
    """How the adapters were trained: rank, scaling and target projections."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    rank: StrictInt = Field(8, ge=1)
    alpha: StrictFloat = Field(16.0, gt=0, allow_inf_nan=False)
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def _pairs(tensors: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """``{"layers.{i}.self_attn.q_proj": {"A": …, "B": …}}``; a lone half is an error."""
    pairs = group_tensors(tensors, _KEY, "the LoRA weights", "a LoRA tensor (…layers.{i}.self_attn.{q,k,v,o}_proj.lora_{A,B}.weight)")
    for name, ab in pairs.items():
        if set(ab) != {"A", "B"}:
            raise ValueError(f"LoRA tensors of {name} lack lora_{'B' if 'A' in ab else 'A'}")
    return pairs


def merge_lora(model: torch.nn.Module, tensors: dict[str, torch.Tensor], spec: LoraSpec, layers: set[int] | None = None) -> dict[str, torch.Tensor]:
    """Add ``scaling · B A`` to every adapted projection of ``model`` (in place).

    Args:
        model: a transformers Llama-family model (no peft layers).
        tensors: peft-named ``lora_A`` ``[r, in]`` / ``lora_B`` ``[out, r]`` weights.
        spec: the adapters' rank and alpha.
        layers: merge only into these layers (``None``: all); the adapters of a layer kept as
            stock attention were trained for a hybrid it no longer runs.

    Returns:
        ``{parameter name: original weight}`` for :func:`restore_weights`.

    Raises:
        ValueError: a tensor names a projection the model lacks, or shapes disagree.
    """
    params = dict(model.named_parameters())
    by_suffix = {name.split("model.", 1)[-1] if "layers." in name else name: name for name in params}
    plan = []
    for target, ab in sorted(_pairs(tensors).items()):
        if layers is not None and int(target.split(".")[1]) not in layers:
            continue
        name = by_suffix.get(f"{target}.weight")
        if name is None:
            raise ValueError(f"the LoRA weights adapt {target}, which this model does not have")
        w, a, b = params[name], ab["A"], ab["B"]
        if a.shape[0] != spec.rank or b.shape[1] != spec.rank or (b.shape[0], a.shape[1]) != tuple(w.shape):
            raise ValueError(f"LoRA of {target}: A {tuple(a.shape)}, B {tuple(b.shape)} do not fit weight {tuple(w.shape)} at rank {spec.rank}")
        plan.append((name, w, a, b))
    originals = {}
    with torch.no_grad():
        for name, w, a, b in plan:
            originals[name] = w.detach().clone()
            delta = (b.to(torch.float32) @ a.to(torch.float32)) * spec.scaling
            w.copy_((w.to(torch.float32) + delta.to(w.device)).to(w.dtype))
    return originals


def restore_weights(model: torch.nn.Module, originals: dict[str, torch.Tensor]) -> None:
    """Undo :func:`merge_lora`: copy the original weights back."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, w in originals.items():
            params[name].copy_(w)
