"""Find the retrieval heads of a model: which K/V heads read a needle when the model copies it.

Calibration prompts are synthetic and deliberately unlike the evaluation: the haystack is
random sentences built from the wonderwords lists, the needle and question use their own
wording (``The passcode of the {key} vault is {value}.``), and seeds are drawn from another
range. The model runs with stock softmax attention over ``prompt + answer`` (teacher forcing);
a recording attention function measures, for each query head, the attention mass that the
queries predicting the answer's digits put on the needle's digits, and averages it over the
query heads of each K/V head and over prompts (Wu et al. 2024 score a head by how often it
copies; the mass is the smooth version of the same signal).
"""

from __future__ import annotations

import contextvars
import random
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any, Iterable

import torch
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, ValidationInfo, field_validator

from lola.io.provenance import versions
from lola.limits import MAX_TOKENS

if TYPE_CHECKING:  # pragma: no cover
    from lola.budgets import HeadBudgets

__all__ = ["CALIBRATION_NEEDLE", "CalibrationPrompt", "calibrate", "calibration_prompts", "random_sentences", "retrieval_scores"]

CALIBRATION_NEEDLE = "The passcode of the {key} vault is {value}."
CALIBRATION_QUESTION = "What is the passcode of the {key} vault? Answer with the number only."
CALIBRATION_ANSWER_PREFIX = " The passcode of the {key} vault is"
# Evaluation samples use seeds run_seed * 100_003 + index; calibration seeds start far above.
_SEED_BASE = 7_000_000_000

_CALIBRATION_ATTENTION = "lola_calibrate"
_RECORD: contextvars.ContextVar[dict | None] = contextvars.ContextVar("lola_calibration_record", default=None)


@dataclass
class CalibrationPrompt:
    """One teacher-forced retrieval prompt.

    Attributes:
        input_ids: ``[1, T]`` prompt, answer prefix and the answer's tokens.
        needle: ``(start, end)`` token span of the value inside the haystack.
        readers: ``(start, end)`` query positions whose next token is one of the answer's.
        sentence: ``(start, end)`` token span of the whole needle sentence (key and value).
    """

    input_ids: torch.Tensor
    needle: tuple[int, int]
    readers: tuple[int, int]
    sentence: tuple[int, int] = (0, 0)


@lru_cache(maxsize=1)
def _words() -> dict[str, list[str]]:
    def load(name: str) -> list[str]:
        text = resources.files("wonderwords").joinpath("assets", name).read_text()
        return [w.strip() for w in text.splitlines() if w.strip().isalpha()]

    return {kind: load(f"{kind}list.txt") for kind in ("adjective", "noun", "verb")}


def random_sentences(n: int, seed: int) -> str:
    """``n`` random sentences ("The quiet lamp follows a brave river.") from the wonderwords lists."""
    w = _words()
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a1, a2 = rng.choice(w["adjective"]), rng.choice(w["adjective"])
        n1, n2 = rng.choice(w["noun"]), rng.choice(w["noun"])
        out.append(f"The {a1} {n1} {rng.choice(w['verb'])}s {rng.choice(['a', 'the', 'every'])} {a2} {n2}.")
    return " ".join(out)


def _find(seq: list[int], sub: list[int], start: int = 0) -> int:
    for i in range(start, len(seq) - len(sub) + 1):
        if seq[i : i + len(sub)] == sub:
            return i
    return -1


def calibration_prompts(tokenizer: Any, length: int, count: int, seed: int = 0) -> list[CalibrationPrompt]:
    """``count`` retrieval prompts of at most ``length`` tokens, needles at evenly spread depths.

    Args:
        tokenizer: the model's tokenizer.
        length: tokens per prompt, answer included.
        count: number of prompts.
        seed: offsets the (evaluation-disjoint) seed range.
    """
    from lola.eval.niah import make_sample

    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    out = []
    for i in range(count):
        s = seed * 1_000 + i + _SEED_BASE
        haystack = random_sentences(max(64, length // 8), s)
        sample = make_sample(
            tokenizer,
            "niah_single_1",
            length,
            (i + 0.5) / count,
            s,
            max_new_tokens=12,
            haystack=haystack,
            needle=CALIBRATION_NEEDLE,
            question=CALIBRATION_QUESTION,
            answer_prefix=CALIBRATION_ANSWER_PREFIX,
        )
        value = sample.answers[0]
        answer = tokenizer(" " + value, add_special_tokens=False).input_ids
        digits = tokenizer(value, add_special_tokens=False).input_ids
        prompt = sample.input_ids[0].tolist()
        at = _find(prompt, digits)
        if at < 0:
            raise RuntimeError(f"could not find the needle's tokens {digits} in calibration prompt {i}")
        ids = torch.tensor([prompt + answer])
        # Query t predicts token t + 1: the readers are the positions just before each answer token.
        readers = (len(prompt) - 1, len(prompt) - 1 + len(answer))
        lead = len(tokenizer(CALIBRATION_NEEDLE.split("{value}")[0].format(key=sample.key).rstrip(), add_special_tokens=False).input_ids)
        out.append(CalibrationPrompt(ids, (at, at + len(digits)), readers, (max(0, at - lead - 1), at + len(digits) + 1)))
    return out


def _recording_attention(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None, **kwargs: Any
):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    record = _RECORD.get()
    if record is not None:
        r0, r1 = record["readers"]
        n0, n1 = record["target"]
        q = query[:, :, r0:r1].float()  # [1, H, R, D]
        h, hkv = query.shape[1], key.shape[1]
        k = key.float().repeat_interleave(h // hkv, dim=1)[:, :, :r1]  # causal: readers see up to r1 - 1
        logits = torch.matmul(q, k.transpose(-1, -2)) * kwargs.get("scaling", module.scaling)
        pos = torch.arange(r1, device=q.device)
        logits = logits.masked_fill(pos[None, :] > torch.arange(r0, r1, device=q.device)[:, None], float("-inf"))
        mass = logits.softmax(-1)[..., n0:n1].sum(-1).mean(-1)[0]  # [H]
        record["scores"][module.layer_idx] = mass.view(hkv, -1).mean(-1).cpu()
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(_CALIBRATION_ATTENTION, _recording_attention)
    AttentionMaskInterface.register(_CALIBRATION_ATTENTION, sdpa_mask)


@torch.no_grad()
def retrieval_scores(model: torch.nn.Module, prompts: list[CalibrationPrompt], progress: Iterable | None = None, target: str = "value") -> torch.Tensor:
    """Mean attention mass from the answer's readers to the needle, per layer and K/V head.

    Args:
        model: a stock transformers decoder (LoLA not applied).
        prompts: from :func:`calibration_prompts`.
        progress: optional wrapper of the prompt loop (e.g. ``tqdm``).
        target: ``"value"`` (the needle's digits) or ``"sentence"`` (the whole needle, key
            included).

    Returns:
        ``[num_layers, num_kv_heads]`` float32 scores in ``[0, 1]``.
    """
    if getattr(model, "_lola", None) is not None:
        raise ValueError("retrieval_scores needs the stock model: call remove_lola(model) first")
    if not prompts:
        raise ValueError("prompts must be non-empty")
    if target not in ("value", "sentence"):
        raise ValueError(f"target must be 'value' or 'sentence', got {target!r}")
    _register()
    cfg = model.config
    total = torch.zeros(cfg.num_hidden_layers, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
    previous = cfg._attn_implementation
    model.set_attn_implementation(_CALIBRATION_ATTENTION)
    device = next(model.parameters()).device
    try:
        for p in progress(prompts) if progress is not None else prompts:
            record = {"readers": p.readers, "target": p.needle if target == "value" else p.sentence, "scores": {}}
            token = _RECORD.set(record)
            try:
                model(p.input_ids.to(device), use_cache=False, logits_to_keep=1)
            finally:
                _RECORD.reset(token)
            if len(record["scores"]) != total.shape[0]:
                raise RuntimeError(f"recorded {len(record['scores'])} of {total.shape[0]} layers: does the model call its attention function?")
            for layer, s in record["scores"].items():
                total[layer] += s
    finally:
        model.set_attn_implementation(previous)
    return total / len(prompts)


class CalibrateSpec(BaseModel):
    """Options of ``lola calibrate`` (the command's options are generated from these fields)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    model: str = Field("smollm2-135m-instruct", description="registered name, .gguf file or Hugging Face folder")
    feature_maps: str | None = Field(
        None,
        description="a `lola linearize` folder or shipped name: the heads of the model with its LoRA merged (the weights LoLA runs on); none: the stock model",
    )
    length: StrictInt = Field(2048, ge=1, le=MAX_TOKENS, description="tokens per calibration prompt")
    prompts: StrictInt = Field(16, ge=1, le=100_000, description="calibration prompts")
    sparse_size: StrictInt = Field(192, ge=0, le=MAX_TOKENS, description="the uniform sparse size to redistribute")
    power: StrictFloat = Field(0.5, ge=0, allow_inf_nan=False, description="budget ∝ score ** power")
    floor: StrictInt = Field(0, ge=0, le=MAX_TOKENS, description="sparse slots every head keeps")
    seed: StrictInt = Field(0, description="offsets the calibration prompts' seeds")

    @field_validator("floor")
    @classmethod
    def _floor_fits(cls, floor: int, info: ValidationInfo) -> int:
        sparse = info.data.get("sparse_size")
        if sparse is not None and floor > sparse:
            raise ValueError(f"must be <= the sparse size ({sparse}), got {floor}")
        return floor


def calibrate(
    model: torch.nn.Module,
    tokenizer: Any,
    *,
    model_name: str = "",
    feature_maps: str | None = None,
    length: int = 2048,
    prompts: int = 16,
    sparse_size: int = 192,
    power: float = 0.5,
    floor: int = 0,
    seed: int = 0,
    progress: bool = True,
) -> "HeadBudgets":
    """Measure retrieval scores on calibration prompts and turn them into per-head budgets.

    Args:
        model, tokenizer: a stock transformers decoder and its tokenizer.
        model_name: recorded in the budgets' ``source``.
        feature_maps: recorded in the budgets' ``source``: the linearized model whose LoRA
            adapters ``model`` holds merged (``None``: the stock model).
        length: tokens per calibration prompt.
        prompts: number of calibration prompts.
        sparse_size: the uniform sparse size whose total is redistributed.
        power, floor: see :func:`lola.budgets.allocate`.
        seed: offsets the calibration seeds.

    Returns:
        :class:`lola.budgets.HeadBudgets` whose total never exceeds ``sparse_size`` per head.

    Raises:
        ValueError: ``length`` beyond the model's positions, or a ``power`` that is not a finite
            number >= 0 (before any prompt runs).
    """
    import math
    import time

    from tqdm.auto import tqdm

    from lola.budgets import HeadBudgets, allocate

    positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if positions and length > positions:
        raise ValueError(f"length {length} exceeds what the model can hold ({positions} positions)")
    if isinstance(power, bool) or not isinstance(power, (int, float)) or not math.isfinite(power) or power < 0:
        raise ValueError(f"power must be a finite number >= 0, got {power!r}")
    t0 = time.perf_counter()
    items = calibration_prompts(tokenizer, length, prompts, seed)
    scores = retrieval_scores(model, items, progress=lambda xs: tqdm(xs, desc="calibrate", disable=not progress))
    sizes = allocate(scores, sparse_size, power=power, floor=floor)
    return HeadBudgets(
        sparse_size_per_head=sizes.tolist(),
        uniform_sparse_size=sparse_size,
        scores=[[round(float(x), 6) for x in row] for row in scores],
        power=power,
        floor=floor,
        source={
            "command": f"lola calibrate --model {model_name}{f' --feature-maps {feature_maps}' if feature_maps else ''} --length {length} --prompts {prompts} --sparse-size {sparse_size} --power {power} --floor {floor} --seed {seed}",
            "model": model_name,
            "feature_maps": feature_maps,
            "length": length,
            "prompts": prompts,
            "floor": floor,
            "seed": seed,
            "haystack": "wonderwords random sentences",
            "needle": CALIBRATION_NEEDLE,
            "seconds": round(time.perf_counter() - t0, 1),
            "versions": versions(),
        },
    )
