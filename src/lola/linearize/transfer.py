"""Attention transfer (LoLCATs stage 1): train the feature maps to imitate softmax attention.

The base model stays frozen. For every layer, the Hedgehog maps ``φ_q, φ_k`` and the window
factors are trained so that the sliding-window + linear hybrid
(:func:`~lola.linearize.hybrid_attention`) reproduces the layer's softmax attention output
(before ``o_proj``), loss ``1000 · MSE``. A layer's loss depends only on its own
``(q, k, v)``, so the model runs once over the text (:func:`collect_activations`) and every
training step then costs one hybrid forward/backward per layer: all layers train together,
each from its own cached activations.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Annotated, Callable, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, model_validator

from lola.config import LoLAConfig
from lola.core.positions import BoundedPositions, RotaryEmbedding
from lola.data.text import TextOption, describe, encode, load_split, token_chunks
from lola.eval.demo import Seed
from lola.feature_maps.registry import DEFAULT_FEATURE_MAP, TRAINABLE_FEATURE_MAPS
from lola.io.provenance import versions
from lola.layer import LoLAAttention, compose
from lola.linearize.checkpoint import run_inputs
from lola.linearize.hybrid import hybrid_attention, state_features
from lola.linearize.teacher import LayerActivations, collect_activations
from lola.linearize.trainer import Trainer, start
from lola.pretrained.folder import REPORT_FILE, model_geometry, write_feature_maps

__all__ = ["LinearizeConfig", "check_positions", "hybrid_config", "layer_loss", "linearize", "spread_positions", "state_mover"]

CHECKPOINT_FILE = "checkpoint.pt"


class LinearizeConfig(BaseModel):
    """Options of ``lola linearize`` (attention transfer)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    window: StrictInt = Field(64, ge=1, description="exact keys per query of the hybrid (η)")
    feature_map: Literal[TRAINABLE_FEATURE_MAPS] = Field(DEFAULT_FEATURE_MAP, description="the feature map trained per layer")
    feature_dim: StrictInt = Field(64, ge=1, description="f of the Hedgehog map (F = 2f); = head_dim for hedgehog_identity")
    mixing: Literal["lolcats", "lola_authors"] = Field(
        "lolcats", description="how the hybrid mixes its window and linear state (the rule the maps are trained for)"
    )
    affine: StrictBool = False
    steps: StrictInt = Field(400, ge=1, description="optimizer steps (batch text chunks, all layers, per step)")
    batch: StrictInt = Field(1, ge=1, description="text chunks per step (the global batch under torchrun)")
    lr: StrictFloat = Field(1e-2, gt=0, description="AdamW learning rate (cosine decay)")
    chunk_tokens: StrictInt = Field(2048, ge=8, description="tokens per chunk: train at the evaluation length")
    train_chunks: StrictInt = Field(24, ge=1, description="distinct training chunks, drawn from the whole training split")
    state_positions: Annotated[StrictInt, Field(ge=1)] | None = Field(
        None,
        description=(
            "train the maps for a read with bounded positions: queries and keys enter them at positions below this, "
            "as a LoLA layer with positions='bounded' and this state_positions moves them (1: un-rotated, a state free of positions); "
            "the folder is then read so; unset: at their own positions"
        ),
    )
    position_spread: Annotated[StrictInt, Field(ge=2)] | None = Field(
        None,
        description=(
            "PoSE: each chunk's positions spread over 0 ... N-1 (cut in two at a random point, the second part after a random skip), "
            "so that the maps see the model's positions up to N with a chunk's distances; the folder is then read with state_positions N; "
            "at most the model's context; unset: 0 ... chunk_tokens-1"
        ),
    )
    cache_activations: StrictBool = Field(
        True, description="keep each chunk's teacher activations (fast; memory grows with train_chunks) or recompute them every step"
    )
    eval_chunks: StrictInt = Field(2, ge=1, description="held-out chunks for the before/after MSE")
    heldout_fraction: StrictFloat = Field(0.1, gt=0, lt=1)
    text: TextOption = Field(None, description="files, folders or corpus names; None: the default corpus")

    checkpoint_every: StrictInt = Field(25, ge=1, description="steps between checkpoints")
    seed: Seed = Field(0, description="seed of the data split, the chunk order and new weights")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where to train (auto: CUDA when available)")

    @model_validator(mode="after")
    def _feature_dim_sizes_hedgehog(self) -> "LinearizeConfig":
        # (a saved config names every field: only a size other than the default was asked for)
        default = type(self).model_fields["feature_dim"].default
        if "feature_dim" in self.model_fields_set and self.feature_map == "hedgehog_identity" and self.feature_dim != default:
            raise ValueError(
                f"feature_dim={self.feature_dim} sizes the hedgehog map only: it does nothing with feature_map='hedgehog_identity' (its size is the head's); drop it"
            )
        return self

    @model_validator(mode="after")
    def _state_positions_move_something(self) -> "LinearizeConfig":
        if self.state_positions is not None and self.position_spread is not None:
            raise ValueError("state_positions moves the maps' inputs below a limit and position_spread spreads them over the model's context: give one of them")
        if self.position_spread is not None and self.position_spread <= self.chunk_tokens:
            raise ValueError(
                f"position_spread={self.position_spread} spreads a {self.chunk_tokens}-token chunk over no more positions than it has: "
                f"give more than chunk_tokens ({self.chunk_tokens}), or leave it unset"
            )
        if self.state_positions is not None and self.state_positions >= self.chunk_tokens:
            raise ValueError(
                f"state_positions={self.state_positions} moves no query or key of a {self.chunk_tokens}-token chunk (positions below it stay): "
                f"give fewer than chunk_tokens ({self.chunk_tokens}), or leave it unset"
            )
        return self


def hybrid_config(cfg: LinearizeConfig) -> LoLAConfig:
    """The LoLA configuration of the trained hybrid: window + linear state, no sparse cache;
    with ``cfg.state_positions`` or ``cfg.position_spread``, the bounded positions the maps were
    trained for (a read of the folder takes them: :meth:`lola.pretrained.FeatureMaps.merge_into`;
    PoSE's keys past the limit spread over the distances it trained)."""
    limit = cfg.state_positions or cfg.position_spread
    bounded = {} if limit is None else {"positions": "bounded", "state_positions": limit}
    if cfg.position_spread is not None:
        # PoSE showed the maps every key at its own distance below the limit: past it a read
        # keeps keys at such distances (clamped, all would sit at distance 0 from the query)
        bounded["state_key_positions"] = "spread"
    return LoLAConfig(
        window=cfg.window,
        sparse_size=0,
        sinks=0,
        schedule="tokenwise",
        feature_map=cfg.feature_map,
        feature_dim=cfg.feature_dim,
        mixing=cfg.mixing,
        affine=cfg.affine,
        **bounded,
    )


def state_mover(model: torch.nn.Module, cfg: LinearizeConfig) -> BoundedPositions | None:
    """What moves the maps' queries and keys during training (``cfg.state_positions``, the
    model's own rotary embedding), or ``None``."""
    if cfg.state_positions is None:
        return None
    return BoundedPositions(RotaryEmbedding.from_model(model), exact_distance=cfg.chunk_tokens, state_positions=cfg.state_positions)


def spread_positions(cfg: LinearizeConfig, index: int) -> torch.Tensor | None:
    """PoSE positions of chunk ``index`` (``-1 − j``: held-out chunk ``j``), ``[T]`` int64, or
    ``None`` without ``cfg.position_spread``: ``0 … c − 1`` then ``c + u … T − 1 + u``, the cut
    ``c`` in ``[1, T)`` and the skip ``u`` in ``[0, N − T]`` drawn from ``(cfg.seed, index)``,
    so a resumed run sees the same positions."""
    if cfg.position_spread is None:
        return None
    t = cfg.chunk_tokens
    g = torch.Generator().manual_seed((cfg.seed * 1_000_003 + index + 10**9) % 2**63)  # (any seed: within the generator's range)
    cut = int(torch.randint(1, t, (1,), generator=g))
    skip = int(torch.randint(0, cfg.position_spread - t + 1, (1,), generator=g))
    pos = torch.arange(t)
    pos[cut:] += skip
    return pos


def layer_loss(student: LoLAAttention, acts: LayerActivations, window: int, mover: BoundedPositions | None = None) -> torch.Tensor:
    """``1000 · MSE`` between the hybrid's output and the softmax output on one chunk; with
    ``mover``, the maps read the queries and keys it moves (the window reads them as they are)."""
    device = student.window_factors.device  # activations live on the CPU; the student may not
    q = acts.q.to(device).float()
    groups = student.num_heads // student.num_kv_heads
    k, v = (x.to(device).float().repeat_interleave(groups, dim=1) for x in (acts.k, acts.v))
    fq, fk = state_features(student, q, k, mover, torch.arange(q.shape[2], device=device)[None, :])
    gate = torch.sigmoid(student.window_factors.float()).view(-1)
    y = hybrid_attention(q, k, v, fq, fk, gate, window, student.scale, student.mixing, student.affine)
    return 1000.0 * torch.mean((y - acts.y.to(device).float()) ** 2)


def _stacked(rows: list[torch.Tensor | None]) -> torch.Tensor | None:
    return None if not rows or rows[0] is None else torch.stack(rows)


def _students(model: torch.nn.Module, cfg: LinearizeConfig) -> dict[int, LoLAAttention]:
    from lola.pretrained.geometry import attention_geometry, attention_modules

    hybrid = hybrid_config(cfg)
    students = {}
    for module in attention_modules(model):
        heads, kv_heads, head_dim = attention_geometry(module)
        # (the students run on cached activations: the state's positions are moved in layer_loss)
        update = {"scale": float(getattr(module, "scaling", head_dim**-0.5)), "positions": "absolute", "state_positions": None}
        layer_cfg = hybrid.model_copy(update=update)
        students[module.layer_idx] = compose(layer_cfg, num_heads=heads, head_dim=head_dim, num_kv_heads=kv_heads)
    return students


def _tensors(students: dict[int, LoLAAttention]) -> dict[str, torch.Tensor]:
    """LoLCATs-named tensors of every student."""
    out = {}
    for i, s in students.items():
        prefix = f"model.layers.{i}.self_attn."
        out[prefix + "feature_map_q.mlp.layer"] = s.feature_map_q.mlp.layer
        out[prefix + "feature_map_k.mlp.layer"] = s.feature_map_k.mlp.layer
        out[prefix + "window_factors"] = s.window_factors
    return out


@torch.no_grad()
def _eval_mse(students: dict[int, LoLAAttention], acts: list[dict[int, LayerActivations]], window: int, mover: BoundedPositions | None) -> dict[int, float]:
    return {i: sum(layer_loss(s, a[i], window, mover).item() for a in acts) / len(acts) / 1000.0 for i, s in students.items()}


def check_positions(model: torch.nn.Module, tokens: int, what: str) -> None:
    """Refuse training sequences of ``tokens`` tokens that the model has no positions for (its
    ``max_position_embeddings``): RoPE beyond them is extrapolated, and maps trained on that would
    imitate attention the model never computes. ``what`` names the setting (``chunk_tokens
    (--chunk-tokens)``)."""
    positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(positions, int) and tokens > positions:
        raise ValueError(f"{what} {tokens} is longer than the model's {positions} positions (max_position_embeddings); use at most {positions}")


def _versions() -> dict:
    return versions()


def linearize(
    model: torch.nn.Module,
    tokenizer,
    cfg: LinearizeConfig,
    out: str | Path,
    model_name: str | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> dict:
    """Train feature maps for every attention layer of ``model`` and write the folder ``out``.

    Resumable: ``out/checkpoint.pt`` (written every ``cfg.checkpoint_every`` steps) is picked
    up by a later call with the same configuration (``steps`` may grow). Under ``torchrun``
    each process takes its share of every step's ``cfg.batch`` chunks (data parallel) and
    rank 0 writes the folder.

    Args:
        model: a stock transformers Llama-family decoder (frozen; not modified).
        tokenizer: its tokenizer (``tokenizer(text, add_special_tokens=False)["input_ids"]``).
        cfg: the training options.
        out: output folder (see :mod:`lola.pretrained.folder`).
        model_name: recorded in the folder's config and report.
        progress: show tqdm progress bars.
        log: where one-line status messages go.

    Returns:
        The report written to ``out/report.json``.

    Raises:
        ValueError: ``cfg.chunk_tokens`` beyond the model's positions, or a checkpoint in
            ``out`` of other options or text.
    """
    out = Path(out)
    check_positions(model, cfg.chunk_tokens, "chunk_tokens (--chunk-tokens)")
    if cfg.position_spread is not None:
        check_positions(model, cfg.position_spread, "position_spread (--position-spread)")
    device, world = start(cfg.device, cfg.batch, out, cfg.seed)
    model.to(device)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    geometry = model_geometry(model)
    mover = state_mover(model, cfg)

    train_text, heldout_text = load_split(cfg.text, cfg.heldout_fraction)
    every = token_chunks(encode(tokenizer, train_text), cfg.chunk_tokens)
    # chunks drawn from the whole split (seeded), not its first ones: the default corpus opens
    # with Python's documentation, and the first chunks alone would all be that
    pick = torch.randperm(every.shape[0], generator=torch.Generator().manual_seed(cfg.seed))[: cfg.train_chunks]
    train = every[pick.sort().values]
    heldout = token_chunks(encode(tokenizer, heldout_text), cfg.chunk_tokens, cfg.eval_chunks)
    if world.main:
        log(
            f"text: {describe(cfg.text)}, {len(train_text) + len(heldout_text):,} characters; "
            f"{train.shape[0]} training and {heldout.shape[0]} held-out chunks of {cfg.chunk_tokens} tokens"
            + (f"; {world.size} processes" if world.size > 1 else "")
        )

    t0 = time.perf_counter()
    eval_acts = collect_activations(model, heldout, position_ids=_stacked([spread_positions(cfg, -1 - j) for j in range(heldout.shape[0])]))
    cached: dict[int, dict[int, LayerActivations]] = {}
    collect_s = time.perf_counter() - t0

    def activations(i: int) -> dict[int, LayerActivations]:
        nonlocal collect_s
        if i in cached:
            return cached[i]
        t = time.perf_counter()
        acts = collect_activations(model, train[i : i + 1], position_ids=_stacked([spread_positions(cfg, i)]))[0]
        collect_s += time.perf_counter() - t
        if cfg.cache_activations:
            cached[i] = acts
        return acts

    students = {i: s.to(device) for i, s in _students(model, cfg).items()}
    params = [p for s in students.values() for p in s.parameters()]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * min(step / cfg.steps, 1.0))))
    mse_before = _eval_mse(students, eval_acts, cfg.window, mover)
    # The text's and the teacher's fingerprints, once: a resume on other content or weights is refused.
    trainer = Trainer(params, optimizer, schedule, world, out / CHECKPOINT_FILE, cfg, geometry, run_inputs(cfg, model=model))
    state = trainer.resume()
    if state is not None:
        for i, s in students.items():
            s.load_state_dict(state["students"][str(i)])
        mse_before = {int(k): v for k, v in state["mse_before"].items()}
        if world.main:
            log(f"resuming from step {trainer.step} of {cfg.steps} ({trainer.checkpoint})")

    def train_item(c: int, share: int) -> torch.Tensor:
        acts = activations(c)
        total = torch.zeros((), device=device)
        for i, s in students.items():
            # each layer trains on its own loss, backward layer by layer: one layer's graph alive at a time
            loss = layer_loss(s, acts[i], cfg.window, mover) / share
            loss.backward()
            total = total + loss.detach()
        return total / len(students)

    trainer.run(
        items=train.shape[0],
        train_item=train_item,
        stage_state=lambda: {"mse_before": {str(k): v for k, v in mse_before.items()}, "students": {str(i): s.state_dict() for i, s in students.items()}},
        desc="attention transfer",
        progress=progress,
        untimed=lambda: collect_s,
        loss_format=".3f",
    )

    mse_after = _eval_mse(students, eval_acts, cfg.window, mover)
    report = {
        "model": model_name,
        "geometry": geometry,
        "config": cfg.model_dump(),
        "processes": world.size,
        "sequences_per_process": trainer.processed,
        "text": {
            "source": describe(cfg.text),
            "characters": len(train_text) + len(heldout_text),
            "train_tokens": int(train.numel()),
            "heldout_tokens": int(heldout.numel()),
        },
        "steps": cfg.steps,
        "seconds": {"teacher_activations": round(collect_s, 1), "training": round(trainer.train_s, 1)},
        "mse_heldout_before": {str(k): v for k, v in mse_before.items()},
        "mse_heldout_after": {str(k): v for k, v in mse_after.items()},
        "mse_heldout_mean": {"before": sum(mse_before.values()) / len(mse_before), "after": sum(mse_after.values()) / len(mse_after)},
        "train_loss": trainer.loss_summary(),
        "versions": _versions(),
    }
    if world.main:
        write_feature_maps(out, _tensors(students), hybrid_config(cfg), geometry, model_name, reports={REPORT_FILE: report})
        log(
            f"held-out MSE (mean over layers): {report['mse_heldout_mean']['before']:.3e} -> {report['mse_heldout_mean']['after']:.3e}; "
            f"training {trainer.train_s / 60:.1f} min; wrote {out}"
        )
    world.barrier()
    return report
