"""Learned token scorers: predict, from a token's key and value, how much it will be read later.

A :class:`TokenScorer` holds one linear model per layer and K/V head over the features
``[R(−p)·k, v, 1]`` of a token (its key with the rotary embedding of its position ``p`` undone,
so that the score does not depend on where the token sits; its value; a bias), ``[F = 2D + 1]``.
It is fitted offline by ``lola fit-scorer`` (:mod:`lola.scorers.fit`) to the log of the attention
a token receives in a stock model's softmax attention, and scores each token on arrival at the
cost of one ``F``-long dot product (the ``learned`` policy, :class:`lola.policies.LearnedScore`).
KVzap (arXiv 2601.07891) fits such regressors to KVzip+ scores; ``lola fit-scorer`` offers that
target and the attention a token actually receives from queries beyond the window.

Scorers for the registered models ship with lola (:func:`available`, sha256-checked on load)::

    scorer = lola.scorers.load("smollm2-135m-instruct")
    cfg = lola.LoLAConfig(policy="learned", policy_kwargs={"scorer": "smollm2-135m-instruct"})
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from lola.errors import UnknownName

__all__ = ["FORMAT", "SHIPPED", "TokenScorer", "available", "default_scorer", "is_scorer_file", "load", "token_features", "unrotate_keys"]

FORMAT = "lola-token-scorer/1"

#: ``{name: sha256}`` of the scorer files shipped in this package (``<name>.safetensors``).
SHIPPED: dict[str, str] = {
    # `lola fit-scorer --model smollm2-135m-instruct --target kvzip`: 32 chunks of 2,048 tokens of
    # the book corpora (no pydoc); its held-out fit is in docs/results.md, "A learned scorer"
    "smollm2-135m-instruct": "273503a3e46ef89dd13a3ad9e0b1fbeff38827b4060645d0001285d4617e55ee",
}


def unrotate_keys(k: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Undo transformers' rotary embedding (half-split layout) of keys at their positions.

    Args:
        k: ``[..., N, D]`` rotated keys.
        pos: ``[..., N]`` their positions (any value for empty slots: their result is unused).
        inv_freq: ``[D/2]`` the model's rotary frequencies (``rotary_emb.inv_freq``).

    Returns:
        ``[..., N, D]`` float32 ``R(−pos)·k``.
    """
    angle = pos.float()[..., None] * inv_freq.float()  # [..., N, D/2], as transformers computes it
    angle = torch.cat([angle, angle], dim=-1)  # dimension i pairs with i + D/2
    cos, sin = angle.cos(), angle.sin()
    k = k.float()
    half = k.shape[-1] // 2
    rotated_half = torch.cat([-k[..., half:], k[..., :half]], dim=-1)
    # R(θ)·k = k cos θ + rot_half(k) sin θ, so R(−θ)·k = k cos θ − rot_half(k) sin θ.
    return k * cos - rotated_half * sin


def token_features(k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor | None) -> torch.Tensor:
    """``[R(−pos)·k, v, 1]``: ``k, v [..., N, D]``, ``pos [..., N]`` → ``[..., N, 2D + 1]`` float32
    (keys are used as they are when ``inv_freq`` is ``None``: a model without rotary embeddings)."""
    key = k.float() if inv_freq is None else unrotate_keys(k, pos, inv_freq)
    return torch.cat([key, v.float(), torch.ones_like(key[..., :1])], dim=-1)


@dataclass(frozen=True)
class TokenScorer:
    """One linear scorer per layer and K/V head.

    Attributes:
        weight: ``[L, Hs, 2D + 1]`` float32 weights over :func:`token_features`.
        inv_freq: ``[D/2]`` float32 rotary frequencies of the model, or ``None``.
        info: what it was fitted for and how (model, target, spec, held-out report).
    """

    weight: torch.Tensor
    inv_freq: torch.Tensor | None = None
    info: dict[str, Any] = field(default_factory=dict)
    _on: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        w = self.weight
        if not isinstance(w, torch.Tensor) or w.dim() != 3 or w.shape[-1] % 2 != 1 or w.shape[-1] < 3:
            raise ValueError(f"weight must be a [layers, kv_heads, 2 * head_dim + 1] tensor, got {getattr(w, 'shape', type(w).__name__)}")
        if not w.is_floating_point() or not bool(torch.isfinite(w).all()):
            raise ValueError("weight must hold finite floating-point numbers")
        if self.inv_freq is not None and (self.inv_freq.dim() != 1 or 2 * self.inv_freq.numel() != self.head_dim):
            raise ValueError(f"inv_freq must be [head_dim / 2] = [{self.head_dim // 2}], got {tuple(self.inv_freq.shape)}")
        if self.inv_freq is not None and not bool(torch.isfinite(self.inv_freq).all()):
            raise ValueError("inv_freq must be finite")

    @property
    def num_layers(self) -> int:
        return self.weight.shape[0]

    @property
    def num_kv_heads(self) -> int:
        return self.weight.shape[1]

    @property
    def head_dim(self) -> int:
        return (self.weight.shape[-1] - 1) // 2

    def check_geometry(self, num_layers: int, num_kv_heads: int, head_dim: int) -> None:
        """Refuse a model this scorer was not fitted for (every number named)."""
        if (self.num_layers, self.num_kv_heads, self.head_dim) != (num_layers, num_kv_heads, head_dim):
            model = self.info.get("model")
            fitted = f" (fitted on {model})" if isinstance(model, str) else ""
            raise ValueError(
                f"the scorer is for {self.num_layers} layers x {self.num_kv_heads} K/V heads x head_dim {self.head_dim}{fitted}, "
                f"but the model has {num_layers} x {num_kv_heads} x {head_dim}: fit one for this model (`lola fit-scorer`)"
            )

    def _tensors(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
        key = str(device)
        if key not in self._on:  # one copy per device, made once (no transfer per step)
            self._on[key] = (self.weight.float().to(device), None if self.inv_freq is None else self.inv_freq.float().to(device))
        return self._on[key]

    def score(self, layer: int, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor, first_head: int | None = None) -> torch.Tensor:
        """Predicted log-attention of tokens of ``layer``: ``k, v [B, Hs, N, D]``, ``pos [B, Hs, N]`` → ``[B, Hs, N]`` float32.

        ``first_head``: ``None``, the keys are every K/V head of the layer; else the model's index
        of the first of ``Hs`` K/V heads (a share of the heads, as a tensor-parallel rank holds)."""
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer {layer} is outside the scorer's {self.num_layers} layers")
        hs = k.shape[1]
        fits = hs == self.num_kv_heads if first_head is None else 0 <= first_head < first_head + hs <= self.num_kv_heads
        first_head = first_head or 0
        if not fits or k.shape[-1] != self.head_dim:
            raise ValueError(
                f"the scorer is for {self.num_kv_heads} K/V heads of dimension {self.head_dim}, got keys {tuple(k.shape)} from head {first_head} "
                "(a scorer scores K/V heads: use gqa_storage='kv_head')"
            )
        weight, inv_freq = self._tensors(k.device)
        return torch.einsum("bhnf,hf->bhn", token_features(k, v, pos, inv_freq), weight[layer, first_head : first_head + hs])

    def save(self, path: str | os.PathLike) -> None:
        """Write the scorer as one safetensors file (its ``info`` as JSON metadata), atomically;
        an existing file is replaced only if it holds a scorer."""
        from safetensors.torch import save

        from lola.io.outputs import write_files

        tensors = {"weight": self.weight.float().contiguous()}
        if self.inv_freq is not None:
            tensors["inv_freq"] = self.inv_freq.float().contiguous()
        body = save(tensors, metadata={"format": FORMAT, "info": json.dumps(self.info)})
        path = Path(path)
        write_files(path.parent, {path.name: body}, ours=is_scorer_file, writer="lola fit-scorer")


def default_scorer(model: str, feature_maps: str | None = None) -> str:
    """The shipped scorer for a registered model: ``"<maps>-linearized"`` when the model runs
    shipped feature maps ``maps`` and one was fitted to its LoRA-merged attention, else the
    model's own.

    Raises:
        ValueError: none ships for ``model`` (fit one with ``lola fit-scorer``).
    """
    if feature_maps is not None and f"{feature_maps}-linearized" in SHIPPED:
        return f"{feature_maps}-linearized"
    if model in SHIPPED:
        return model
    raise ValueError(
        f"no scorer ships for model {model!r} (shipped: {', '.join(available()) or 'none'}): fit one with `lola fit-scorer` "
        "and give it as policy_kwargs {scorer: FILE} in a variant"
    )


def available() -> list[str]:
    """Names of the scorers shipped with lola."""
    return sorted(SHIPPED)


def _shipped_path(name: str) -> Path:
    from lola.io.checksums import sha256_file

    path = Path(str(resources.files(__name__).joinpath(f"{name}.safetensors")))
    if not path.is_file():
        raise FileNotFoundError(f"the shipped scorer {name!r} is missing from the installation ({path.name}): reinstall lola")
    digest = sha256_file(path)
    if digest != SHIPPED[name]:
        raise ValueError(f"the shipped scorer {name!r} is damaged (sha256 {digest[:12]}…, expected {SHIPPED[name][:12]}…): reinstall lola")
    return path


def _read(path: Path) -> TokenScorer:
    from safetensors import SafetensorError, safe_open

    from lola.io.outputs import check_regular_file

    check_regular_file(path, "a token scorer file (`lola fit-scorer`)")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            names = set(f.keys())
            if meta.get("format") != FORMAT or "weight" not in names or not names <= {"weight", "inv_freq"}:
                raise ValueError(f"{path} is not a token scorer file (format {meta.get('format')!r}, tensors {sorted(names)}; expected {FORMAT!r})")
            tensors = {n: f.get_tensor(n) for n in names}
        info = json.loads(meta.get("info", "{}"))
    except (SafetensorError, OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not a readable token scorer file: {err}") from None
    if not isinstance(info, dict):
        raise ValueError(f"{path}: the scorer's info must be a JSON object")
    try:
        return TokenScorer(tensors["weight"], tensors.get("inv_freq"), info)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


_LOADED: dict[tuple, TokenScorer] = {}


def load(name_or_path: str | os.PathLike) -> TokenScorer:
    """A shipped scorer by name (:func:`available`) or a ``lola fit-scorer`` file.

    Loaded once per name (or per file, its size and modification time): every layer's policy
    shares one copy.

    Raises:
        lola.errors.UnknownName: a name that is neither shipped nor an existing file.
        ValueError: a file that is not a scorer, or a damaged shipped one.
    """
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"scorer must be a shipped name or a path, got {name_or_path!r} ({type(name_or_path).__name__})")
    name = str(name_or_path)
    if not name.strip():  # Path("") is the current folder, which nobody meant
        raise ValueError(f"scorer is empty: give a shipped name ({', '.join(available()) or 'none'}) or a `lola fit-scorer` file")
    if name in SHIPPED and not Path(name).exists():
        key: tuple = ("shipped", name)
        if key not in _LOADED:
            _LOADED[key] = _read(_shipped_path(name))
        return _LOADED[key]
    path = Path(name).expanduser()
    if not path.exists():
        raise UnknownName(f"no shipped scorer named {name!r} and no such file; available: {', '.join(available()) or 'none'} (or a `lola fit-scorer` file)")
    st = path.stat()
    key = ("file", str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _LOADED:
        _LOADED[key] = _read(path)
    return _LOADED[key]


def is_scorer_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` holds a token scorer (``lola fit-scorer`` output, which may be replaced)."""
    try:
        _read(Path(path))
    except (ValueError, OSError):
        return False
    return True
