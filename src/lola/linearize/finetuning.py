"""Stage 2 of linearization (LoLCATs): LoRA fine-tuning of the hybrid against the frozen model.

Attention transfer (stage 1, :mod:`lola.linearize.transfer`) teaches each layer's feature maps
to imitate softmax attention one layer at a time; the errors still add up across 30 layers, and
the hybrid writes poorly. Stage 2 trains the whole model end to end: low-rank adapters on the
q, k, v, o projections (``peft``), the feature maps and the window factors, so that the hybrid's
next-token distribution matches the stock model's (KL divergence to the teacher, plus an
optional cross-entropy term), on sequences as long as the evaluation's.

The teacher is the same model with the adapters switched off and stock attention: no second
copy of the weights. The student runs the hybrid in parallel form through the ``"lola_hybrid"``
attention function (:mod:`lola.linearize.training_attention`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from pathlib import Path
from typing import Callable, Iterator, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt

from lola.config import LoLAConfig
from lola.data.text import TextOption, describe, encode, load_split, token_chunks
from lola.eval.demo import Seed
from lola.linearize.checkpoint import run_inputs
from lola.linearize.distributed import World
from lola.linearize.trainer import Trainer, start
from lola.pretrained.folder import CONFIG_FILE, FINETUNE_REPORT_FILE, REPORT_FILE, check_geometry, model_geometry, read_feature_maps, write_feature_maps
from lola.pretrained.lora import LoraSpec

__all__ = ["FINETUNE_REPORT_FILE", "FinetuneConfig", "distillation_loss", "finetune"]

FINETUNE_CHECKPOINT_FILE = "checkpoint-stage2.pt"


class FinetuneConfig(BaseModel):
    """Options of stage 2 (``lola linearize --stage 2``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    steps: StrictInt = Field(150, ge=1, description="optimizer steps")
    batch: StrictInt = Field(1, ge=1, description="sequences per step (the global batch under torchrun)")
    seq_len: StrictInt = Field(2048, ge=8, description="tokens per training sequence")
    lr: StrictFloat = Field(1e-3, gt=0, description="AdamW learning rate of the LoRA weights")
    maps_lr: StrictFloat = Field(1e-3, ge=0, description="learning rate of the feature maps and window factors (0: frozen)")
    warmup_steps: StrictInt = Field(10, ge=0, description="steps of linear warm-up before the cosine decay")
    lora_rank: StrictInt = Field(8, ge=1, description="LoRA rank")
    lora_alpha: StrictFloat = Field(16.0, gt=0, description="LoRA alpha (the update is scaled by alpha / rank)")
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    kl_weight: StrictFloat = Field(1.0, ge=0, description="weight of KL(teacher || student) on the next-token distributions")
    ce_weight: StrictFloat = Field(0.0, ge=0, description="weight of the next-token cross-entropy on the text")
    eval_chunks: StrictInt = Field(2, ge=0, description="held-out sequences for the before/after KL")
    heldout_fraction: StrictFloat = Field(0.1, gt=0, lt=1)
    text: TextOption = Field(None, description="files, folders or corpus names; None: the default corpus")

    # The LoLCATs recipe trains the sliding-window hybrid; LoLA then reads it with a sparse cache
    # and a rule it never saw. A LoLA config here trains through the layers as they run at
    # inference instead, so the state learns to complement the cache (the selection itself is
    # not differentiated).
    lola: LoLAConfig | None = Field(
        None,
        description="None: train the sliding-window hybrid (LoLCATs); a LoLA config: train through LoLA layers as they run with it at inference (sinks, window, sparse cache and its policy, schedule, mixing rule)",
    )
    from_lora: StrictBool = Field(False, description="start from the LoRA weights of the starting folder (a stage-2 folder) instead of new adapters")
    # Through LoLA the autograd graph holds every chunk step of every layer, so memory grows with
    # the length: SmolLM2-135M's peak on CPU, and the length that did not fit, are in docs/results.md,
    # "The paper's rule: LoLA on the shipped hybrid, measured to the end".
    gradient_checkpointing: StrictBool = Field(
        False, description="recompute each decoder layer in the backward pass: one layer's activations in memory instead of all, for about a third more time"
    )
    checkpoint_every: StrictInt = Field(10, ge=1, description="steps between checkpoints")
    seed: Seed = Field(0, description="seed of the data split, the chunk order and new weights")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where to train (auto: CUDA when available)")

    def lora_spec(self) -> LoraSpec:
        return LoraSpec(rank=self.lora_rank, alpha=self.lora_alpha, targets=self.lora_targets)


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, ids: torch.Tensor, kl_weight: float, ce_weight: float) -> torch.Tensor:
    """``kl_weight · KL(teacher ‖ student) + ce_weight · CE(next token)``, both per-token means.

    Args:
        student_logits, teacher_logits: ``[B, T, V]``.
        ids: ``[B, T]`` the tokens (the cross-entropy predicts ``ids[:, 1:]``).
    """
    s = student_logits.float().log_softmax(-1)
    loss = s.new_zeros(())
    if kl_weight:
        t = teacher_logits.float().log_softmax(-1)
        kl = (t.exp() * (t - s)).sum(-1).mean()
        loss = loss + kl_weight * kl
    if ce_weight:
        ce = F.nll_loss(s[:, :-1].reshape(-1, s.shape[-1]), ids[:, 1:].reshape(-1))
        loss = loss + ce_weight * ce
    return loss


def _lora_layers(model: torch.nn.Module) -> list:
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer)]


@contextlib.contextmanager
def _teacher(model: torch.nn.Module, attn_implementation: str) -> Iterator[None]:
    """The stock model: adapters off, stock attention (parameters' ``requires_grad`` kept)."""
    from lola.integrations.transformers.model_record import attention_switched

    layers = _lora_layers(model)
    grads = {id(p): p.requires_grad for p in model.parameters()}
    for m in layers:
        m.enable_adapters(False)
    try:
        with attention_switched(model, attn_implementation):  # stock attention, on purpose
            yield
    finally:
        for m in layers:
            m.enable_adapters(True)
        for p in model.parameters():
            p.requires_grad_(grads[id(p)])


def _prepare(model: torch.nn.Module, maps_folder: str | Path, cfg: FinetuneConfig, resuming: bool) -> tuple[str, list, list]:
    """apply_lola with the stage-1 maps, inject LoRA, switch to the training hybrid.

    Returns:
        ``(stock attention implementation, LoRA parameters, map parameters)``.
    """
    from peft import LoraConfig, inject_adapter_in_model

    from lola.integrations.transformers import apply_lola
    from lola.linearize.training_attention import HYBRID_ATTENTION, register_hybrid_attention

    maps = read_feature_maps(maps_folder)
    check_geometry(maps, model)
    start_lora = None
    if cfg.from_lora:
        if maps.lora is None:
            raise ValueError(f"from_lora: {maps_folder} holds no LoRA weights to start from (a stage-2 folder has lora.safetensors)")
        if maps.lora_spec != cfg.lora_spec():
            raise ValueError(
                f"from_lora: the LoRA weights in {maps_folder} are {maps.lora_spec}; this run asks for {cfg.lora_spec()} (set the same rank, alpha and targets)"
            )
        start_lora = maps.lora
    elif maps.lora is not None and not resuming:
        raise ValueError(
            f"{maps_folder} already holds stage-2 LoRA weights and no stage-2 checkpoint; stage 2 starts from stage-1 maps (use another --out, or --from-lora to continue from them)"
        )
    maps = dataclasses.replace(maps, lora=None, lora_spec=None)  # adapters are injected below; a checkpoint restores every trained tensor
    stock = model.config._attn_implementation
    apply_lola(model, maps.config if cfg.lola is None else cfg.lola, feature_maps=maps)
    inject_adapter_in_model(LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, target_modules=list(cfg.lora_targets), lora_dropout=0.0), model)
    if start_lora is not None:
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, start_lora)
        unmatched = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
        if unmatched:
            raise ValueError(f"from_lora: {len(unmatched)} LoRA tensors of {maps_folder} match no adapter of this model (e.g. {unmatched[0]})")
    if cfg.lola is None:
        register_hybrid_attention()
        model.set_attn_implementation(HYBRID_ATTENTION)
    # else: the "lola" attention apply_lola installed, i.e. the inference path itself (its
    # reference engine when autograd needs gradients: lola.kernels.dispatch)
    lora, maps_params = [], []
    for name, p in model.named_parameters():
        if "lora_" in name:
            lora.append(p)
            p.requires_grad_(True)
        elif ".lola." in name and cfg.maps_lr > 0:
            maps_params.append(p)
            p.requires_grad_(True)
        else:
            p.requires_grad_(False)
    return stock, lora, maps_params


def _enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """transformers' per-layer checkpointing (it runs only in training mode, so the model goes to
    ``train()``: refused when that would switch on dropout)."""
    dropout = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Dropout) and m.p > 0]
    if getattr(model.config, "attention_dropout", 0.0) or dropout:
        raise ValueError(f"gradient_checkpointing runs the model in training mode, and this model has dropout ({dropout[:1] or 'attention_dropout'})")
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(f"gradient_checkpointing: {type(model).__name__} does not support it")
    kwargs = {"use_reentrant": False}  # frozen inputs: the reentrant variant would drop the grads
    if hasattr(model, "activation_checkpointing_enable"):  # its name since transformers 5.x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.train()


def _lora_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    from peft import get_peft_model_state_dict

    return {k: v.detach().float().cpu() for k, v in get_peft_model_state_dict(model).items()}


def _map_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    from lola.linearize.transfer import _tensors

    return _tensors(model._lola.modules)


def finetune(
    model: torch.nn.Module,
    tokenizer,
    cfg: FinetuneConfig,
    out: str | Path,
    maps: str | Path | None = None,
    model_name: str | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> dict:
    """Stage 2: train LoRA + feature maps of ``model``'s hybrid against the stock model.

    Resumable: ``out/checkpoint-stage2.pt`` (every ``cfg.checkpoint_every`` steps) is picked up
    by a later call with the same options (``steps`` may grow) and the same stage-1 maps (their
    fingerprint is in the checkpoint). Under ``torchrun`` each process takes its share of every
    step's ``cfg.batch`` sequences (data parallel); rank 0 writes.

    Args:
        model: a stock transformers Llama-family model (modified: adapters are injected).
        tokenizer: its tokenizer.
        cfg: the options.
        out: the output folder: gets ``feature_maps.safetensors`` (updated maps),
            ``lora.safetensors``, ``lola_config.json`` and ``finetune_report.json``.
        maps: the stage-1 folder to start from (default: ``out`` itself).
        model_name: recorded in the folder.

    Returns:
        The report written to ``out/finetune_report.json``.

    Raises:
        ValueError: ``cfg.seq_len`` beyond the model's positions, or a checkpoint in ``out`` of
            other options, text or stage-1 maps (stage 1 retrained since it started).
    """

    from lola.linearize.transfer import check_positions
    from lola.pretrained.shipped import resolve_feature_maps

    out = Path(out)
    start_name = str(out if maps is None else maps)  # as given: a shipped name stays a name in the report
    maps = out if maps is None else resolve_feature_maps(maps)
    if not (Path(maps) / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"stage 2 starts from stage-1 feature maps: {maps} has no {CONFIG_FILE} (run `lola linearize --stage 1 --out {maps}` first)")
    check_positions(model, cfg.seq_len, "seq_len (--chunk-tokens)")
    geometry = model_geometry(model)
    ckpt = out / FINETUNE_CHECKPOINT_FILE
    # The text and the stage-1 maps, fingerprinted before this run writes its own maps over
    # them: a checkpoint that started from other maps (stage 1 retrained since) is refused.
    inputs = run_inputs(cfg, stage1_maps=maps, model=model)  # the teacher's weights too, before adapters go in
    if cfg.from_lora and out.resolve() == maps.resolve():
        raise ValueError(f"from_lora: the output folder must not be the folder it continues from ({maps}); choose another out")
    if cfg.from_lora:  # the LoRA weights it continues from, too
        from lola.io.checksums import content_digest

        inputs["start"] = content_digest(maps)
    # A checkpoint is checked before any work (its optimizer state is restored once built below).
    trainer = Trainer([], None, None, World(), ckpt, cfg, geometry, inputs, steps_option="--stage2-steps")
    state = trainer.read()
    device, world = start(cfg.device, cfg.batch, out, cfg.seed)
    model.to(device).eval()  # no dropout in either pass
    if cfg.gradient_checkpointing:
        _enable_gradient_checkpointing(model)
    maps_cfg = read_feature_maps(maps).config

    train_text, heldout_text = load_split(cfg.text, cfg.heldout_fraction)
    train = token_chunks(encode(tokenizer, train_text), cfg.seq_len)
    heldout = token_chunks(encode(tokenizer, heldout_text), cfg.seq_len, cfg.eval_chunks) if cfg.eval_chunks else train[:0]
    if world.main:
        log(
            f"text: {describe(cfg.text)}, {len(train_text) + len(heldout_text):,} characters; {train.shape[0]} training sequences of {cfg.seq_len} tokens "
            f"({train.numel():,} tokens; {cfg.steps * cfg.batch * cfg.seq_len:,} seen in {cfg.steps} steps), {heldout.shape[0]} held out"
            + (f"; {world.size} processes" if world.size > 1 else "")
        )

    stock, lora_params, map_params = _prepare(model, maps, cfg, resuming=state is not None)
    groups = [{"params": lora_params, "lr": cfg.lr}]
    if map_params:
        groups.append({"params": map_params, "lr": cfg.maps_lr})
    optimizer = torch.optim.AdamW(groups, weight_decay=0.0)

    def lr_factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / (cfg.warmup_steps + 1)
        return 0.5 * (1 + math.cos(math.pi * min((step - cfg.warmup_steps) / max(cfg.steps - cfg.warmup_steps, 1), 1.0)))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    trainable = lora_params + map_params
    trainer.params, trainer.optimizer, trainer.schedule, trainer.world = trainable, optimizer, schedule, world

    def sequence_loss(ids: torch.Tensor) -> torch.Tensor:
        ids = ids.to(device).view(1, -1)
        with torch.no_grad(), _teacher(model, stock):
            teacher = model(ids, use_cache=False).logits
        student = model(ids, use_cache=False).logits
        return distillation_loss(student, teacher, ids, cfg.kl_weight, cfg.ce_weight)

    @torch.no_grad()
    def heldout_kl() -> float | None:
        if heldout.shape[0] == 0:
            return None
        ids = heldout.to(device)
        kls = torch.zeros((), dtype=torch.float64, device=device)
        rows = world.shard(list(range(ids.shape[0])))
        for row in rows:
            with _teacher(model, stock):
                t = model(ids[row : row + 1], use_cache=False).logits
            s = model(ids[row : row + 1], use_cache=False).logits
            kls = kls + distillation_loss(s, t, ids[row : row + 1], 1.0, 0.0).double()
        total = torch.stack([kls.cpu(), torch.tensor(float(len(rows)), dtype=torch.float64)])
        if world.size > 1:
            torch.distributed.all_reduce(total)  # ranks may hold unequal shares of the held-out rows
        return float(total[0] / total[1])

    if state is not None:
        trainer.resume(state)
        with torch.no_grad():
            for p, saved_p in zip(trainable, state["trainable"]):
                p.copy_(saved_p)
        kl_before = state["kl_before"]
        if world.main:
            log(f"resuming stage 2 from step {trainer.step} of {cfg.steps} ({ckpt})")
    else:
        kl_before = heldout_kl()

    def train_item(i: int, share: int) -> torch.Tensor:
        loss = sequence_loss(train[i]) / share
        loss.backward()
        return loss.detach()

    trainer.run(
        items=train.shape[0],
        train_item=train_item,
        stage_state=lambda: {"kl_before": kl_before, "trainable": [p.detach().cpu() for p in trainable]},
        desc="stage 2 (LoRA)",
        progress=progress,
    )

    kl_after = heldout_kl()
    report = {
        "model": model_name,
        "geometry": geometry,
        "config": cfg.model_dump(mode="json"),
        # what the student ran: the hybrid, or LoLA with its rule decided (lola.pretrained.resolve)
        "student_config": model._lola.config.model_dump(mode="json"),
        "start_maps": start_name,
        "inputs": inputs,  # the stage-1 maps' fingerprint outlives them here (see stage1_digest)
        "processes": world.size,
        "sequences_per_process": trainer.processed,
        "device": str(device),
        "text": {
            "source": describe(cfg.text),
            "characters": len(train_text) + len(heldout_text),
            "train_tokens": int(train.numel()),
            "heldout_tokens": int(heldout.numel()),
            "tokens_seen": cfg.steps * cfg.batch * cfg.seq_len,
        },
        "steps": cfg.steps,
        "seconds": {"training": round(trainer.train_s, 1)},
        "kl_heldout": {"before": kl_before, "after": kl_after},
        "train_loss": trainer.loss_summary(),
    }
    reports = {FINETUNE_REPORT_FILE: report}
    if world.main:
        from lola.io.outputs import read_json
        from lola.linearize.transfer import _versions

        report["versions"] = _versions()
        # the reports of what this run started from travel with the maps into another folder:
        # stage 1's as it is, a continued stage 2's inside this one
        if maps.resolve() != out.resolve() and (maps / REPORT_FILE).is_file():
            reports[REPORT_FILE] = read_json(maps / REPORT_FILE, "the stage-1 report")
        if cfg.from_lora and (maps / FINETUNE_REPORT_FILE).is_file():
            report["continued_from"] = read_json(maps / FINETUNE_REPORT_FILE, "the stage-2 report it continues")
        write_feature_maps(
            out,
            _map_tensors(model),
            maps_cfg,
            geometry,
            model_name,
            lora=_lora_tensors(model),
            lora_spec=cfg.lora_spec(),
            reports=reports,
        )
        log(
            f"held-out KL to the teacher: {kl_before if kl_before is None else f'{kl_before:.4f}'} -> "
            f"{kl_after if kl_after is None else f'{kl_after:.4f}'}; training {trainer.train_s / 60:.1f} min; wrote {out}"
        )
    world.barrier()
    return report
