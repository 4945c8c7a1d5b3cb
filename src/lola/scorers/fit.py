"""Fit a :class:`~lola.scorers.TokenScorer` to the attention a stock model gives its tokens.

The model runs over token chunks of a text corpus with a recording attention function that,
per layer and K/V head, computes the softmax attention exactly (float32) and turns it into one
*target* per key ``j``:

- ``"future"``: ``max`` over the queries ``i ≥ j + min_distance`` (beyond the window: what the
  sparse cache must serve) and over the query heads of the group of ``a_ij``; only keys with at
  least ``min_future`` such queries are used, so that every target saw enough of the future;
- ``"kvzip"`` (KVzip, Kim et al. 2025): the chunk is followed by a request to repeat it and the
  chunk again; the target is the max over the repeating queries (and the group) of ``a_ij``.

The regression is ridge least squares of ``log(target)`` on :func:`~lola.scorers.token_features`,
accumulated as sufficient statistics (``XᵀX, Xᵀy``: a few MB whatever the corpus size), so a run
is checkpointed after every chunk and resumes where it stopped. Held-out chunks (the other side of
:func:`lola.data.text.load_split`) then measure the fit per layer: the rank correlation of predicted
and true targets and the recall of the true top 10% by the predicted top 10%.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, model_validator

from lola.io.provenance import versions
from lola.limits import MAX_TOKENS
from lola.scorers import TokenScorer, token_features

__all__ = [
    "DEFAULT_TEXT",
    "REPEAT_PROMPT",
    "FitSpec",
    "fit_scorer",
    "format_report",
    "future_targets",
    "kvzip_targets",
    "rank_metrics",
    "record_targets",
    "recording",
    "solve_ridge",
    "text_chunks",
    "check_resume",
]

#: The corpora a scorer is fitted on by default: every registered book corpus except ``pydoc``,
#: which is the prose haystack of ``lola niah`` (a scorer must not learn the evaluation's text).
DEFAULT_TEXT = ("wikipedia", "kjv", "haydock", "recipes", "history")

#: KVzip's request to reproduce the context (its queries read what a token holds).
REPEAT_PROMPT = "\n\nRepeat the previous context exactly.\n\n"

FIT_ATTENTION = "lola_scorer_fit"
_RECORD: contextvars.ContextVar[dict | None] = contextvars.ContextVar("lola_scorer_fit_record", default=None)

#: Tokens at the start of a chunk left out of the fit: the attention sinks, kept exact anyway.
SKIP_FIRST = 4


class FitSpec(BaseModel):
    """Everything that defines a fit (saved in the checkpoint and the scorer; a resume must match)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: str = Field("smollm2-135m-instruct", description="registered name, .gguf file or Hugging Face folder")
    feature_maps: str | None = Field(
        None, description="a `lola linearize` folder or shipped name: fit to the attention of the model with its LoRA merged; none: the stock model"
    )
    target: Literal["future", "kvzip"] = Field(
        "future", description="future: attention from queries beyond min_distance; kvzip: attention while the model repeats the text"
    )
    text: list[str] = Field(
        default_factory=lambda: list(DEFAULT_TEXT), min_length=1, description="corpora or text files to fit on (the registered book corpora, without pydoc)"
    )
    length: StrictInt = Field(2048, ge=64, le=MAX_TOKENS, description="tokens per chunk")
    documents: StrictInt = Field(32, ge=1, le=100_000, description="training chunks")
    heldout: StrictInt = Field(8, ge=1, le=10_000, description="held-out chunks for the report")
    min_distance: StrictInt = Field(64, ge=1, le=MAX_TOKENS, description="future target: queries at least this far after the key (the window)")
    min_future: StrictInt = Field(256, ge=1, le=MAX_TOKENS, description="future target: fit keys with at least this many such queries")
    ridge: StrictFloat = Field(1e-3, ge=0, allow_inf_nan=False, description="ridge penalty, relative to each feature's energy")

    def keys(self) -> tuple[int, int]:
        """The range of key positions of a chunk that are fitted."""
        if self.target == "future":
            return SKIP_FIRST, self.length - self.min_distance - self.min_future + 1
        return SKIP_FIRST, self.length

    def positions(self) -> int:
        """Positions the model must hold: a chunk, or for ``kvzip`` a chunk, the request and the chunk again."""
        return self.length if self.target == "future" else 2 * self.length + 16

    @model_validator(mode="after")
    def _future_options_need_the_future_target(self) -> "FitSpec":
        given = [f for f in ("min_distance", "min_future") if f in self.model_fields_set]
        if self.target != "future" and given:
            one = len(given) == 1
            raise ValueError(
                f"{' and '.join(given)} {'sets' if one else 'set'} the future target only: {'it does' if one else 'they do'} nothing with "
                f"target={self.target!r}; drop {'it' if one else 'them'}"
            )
        return self

    @model_validator(mode="after")
    def _leaves_keys_to_fit(self) -> "FitSpec":
        # Checked with the options (before a model loads): a chunk must leave keys to fit.
        lo, hi = self.keys()
        if hi - lo < 16:
            least = self.min_distance + self.min_future + SKIP_FIRST + 15
            raise ValueError(
                f"length (--length) {self.length} leaves {hi - lo} keys to fit per chunk after min_distance (--min-distance) {self.min_distance} "
                f"and min_future (--min-future) {self.min_future}: make the length at least {least}"
            )
        return self


def future_targets(probs: torch.Tensor, min_distance: int) -> torch.Tensor:
    """``[g, T, T]`` causal attention of a group's query heads → ``[T]``: per key, the largest
    weight any query at least ``min_distance`` tokens later gives it (0 when there is none).
    Overwrites ``probs``."""
    return probs.tril_(-min_distance).amax(dim=(0, 1))  # keeps key j <= query i - min_distance


def kvzip_targets(probs: torch.Tensor, context: int) -> torch.Tensor:
    """``[g, R, T]`` attention of the repeating queries → ``[context]``: per context key, the
    largest weight a repeating query gives it."""
    return probs[..., :context].amax(dim=(0, 1))


def solve_ridge(xtx: torch.Tensor, xty: torch.Tensor, ridge: float) -> torch.Tensor:
    """``argmin_w ‖Xw − y‖² + ridge · Σ_f (XᵀX)_ff w_f²`` (the last feature, the bias, unpenalised):
    ``xtx [..., F, F]``, ``xty [..., F]`` → ``[..., F]`` float64. Scaling each penalty by the
    feature's own energy makes ``ridge`` independent of the features' units."""
    xtx = xtx.double()
    diag = torch.diagonal(xtx, dim1=-2, dim2=-1).clone()
    diag[..., -1] = 0.0
    a = xtx + torch.diag_embed(ridge * diag + 1e-9 * diag.mean(dim=-1, keepdim=True).clamp_min(1.0))
    return torch.linalg.solve(a, xty.double())


def rank_metrics(pred: torch.Tensor, true: torch.Tensor, top: float = 0.1) -> tuple[float, float]:
    """``(Spearman correlation, recall of the true top fraction by the predicted top fraction)``
    of two ``[N]`` score vectors."""
    n = pred.numel()
    rp = pred.double().argsort().argsort().double()
    rt = true.double().argsort().argsort().double()
    rp, rt = rp - rp.mean(), rt - rt.mean()
    rho = float((rp * rt).sum() / (rp.norm() * rt.norm()).clamp_min(1e-12))
    k = max(1, int(round(top * n)))
    hit = len(set(pred.topk(k).indices.tolist()) & set(true.topk(k).indices.tolist()))
    return rho, hit / k


def _recording_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any, **kwargs: Any):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    record = _RECORD.get()
    if record is not None:
        spec: FitSpec = record["spec"]
        scaling = kwargs.get("scaling", module.scaling)
        t = query.shape[2]
        h, hkv = query.shape[1], key.shape[1]
        g = h // hkv
        lo, hi = record["keys"]
        pos = torch.arange(t, device=key.device)
        rows = record["rows"]
        # -inf above the diagonal (causal), built once per chunk and shared by every layer
        if record.get("mask") is None:
            record["mask"] = torch.zeros(t - rows, t, device=key.device).masked_fill_(pos[None, :] > pos[rows:, None], float("-inf"))
        for head in range(hkv):
            k = key[0, head].float()  # [T, D]
            q = query[0, head * g : (head + 1) * g, rows:].float()  # [g, T - rows, D]
            probs = torch.baddbmm(record["mask"].expand(g, -1, -1), q, k.T.expand(g, -1, -1), alpha=scaling).softmax(dim=-1)
            target = future_targets(probs, spec.min_distance) if spec.target == "future" else kvzip_targets(probs, spec.length)
            record["sink"](module.layer_idx, head, k[lo:hi], value[0, head, lo:hi].float(), pos[lo:hi], target[lo:hi])
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


@contextlib.contextmanager
def recording(model: torch.nn.Module) -> Iterator[None]:
    """Within: ``model``'s attention layers run the recording attention function (outputs
    unchanged: SDPA computes them), so :func:`record_targets` sees every layer."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(FIT_ATTENTION, _recording_attention)
    AttentionMaskInterface.register(FIT_ATTENTION, sdpa_mask)
    previous = model.config._attn_implementation
    model.set_attn_implementation(FIT_ATTENTION)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


Sink = Callable[[int, int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]


def record_targets(model: torch.nn.Module, tokenizer: Any, chunk: torch.Tensor, spec: FitSpec, sink: Sink) -> None:
    """Run one ``[length]`` chunk through ``model`` (inside :func:`recording`) and call
    ``sink(layer, kv_head, k [N, D], v [N, D], pos [N], target [N])`` for the fitted keys
    (:meth:`FitSpec.keys`) of every layer and K/V head; ``k`` is rotated as attention sees it."""
    if model.config._attn_implementation != FIT_ATTENTION:
        raise RuntimeError("record_targets runs inside `with recording(model):`")
    ids, rows = _inputs(tokenizer, chunk, spec)
    token = _RECORD.set({"spec": spec, "keys": spec.keys(), "rows": rows, "sink": sink})
    try:
        model(ids.to(next(model.parameters()).device), use_cache=False, logits_to_keep=1)
    finally:
        _RECORD.reset(token)


def _inv_freq(model: torch.nn.Module) -> torch.Tensor | None:
    rotary = getattr(getattr(model, "model", model), "rotary_emb", None)
    f = getattr(rotary, "inv_freq", None)
    return None if f is None else f.detach().float().cpu().clone()


def text_chunks(tokenizer: Any, text: str, length: int, count: int, what: str) -> list[torch.Tensor]:
    """``count`` chunks of ``length`` tokens from evenly spaced places of ``text`` (each starts at
    a word boundary after its offset), ``[length]`` int64 each."""
    from lola.data.text import encode

    span = 12 * length  # characters: English runs at about 4–5 per token
    if len(text) < span:
        raise ValueError(f"the {what} text holds {len(text)} characters, too few for a chunk of {length} tokens")
    step = (len(text) - span) / max(count - 1, 1)
    chunks = []
    for i in range(count):
        start = int(i * step)
        piece = text[start : start + span]
        cut = piece.find(" ") + 1 if i else 0
        ids = encode(tokenizer, piece[cut:])
        if ids.numel() < length:
            raise ValueError(f"a chunk of the {what} text at character {start} holds {ids.numel()} tokens, fewer than {length}")
        chunks.append(ids[:length])
    return chunks


def _inputs(tokenizer: Any, chunk: torch.Tensor, spec: FitSpec) -> tuple[torch.Tensor, int]:
    """The model's input for a chunk and the first query row whose attention is recorded."""
    if spec.target == "future":
        return chunk[None], 0
    from lola.data.text import encode

    ask = encode(tokenizer, REPEAT_PROMPT)
    return torch.cat([chunk, ask, chunk])[None], chunk.numel() + ask.numel()


def _checkpoint_path(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


CHECKPOINT_FORMAT = "lola-scorer-fit-checkpoint/1"
STATISTICS = ("n", "xtx", "xty")
"""The tensors of a checkpoint: ``xtx [L, Hkv, F, F]``, ``xty [L, Hkv, F]``, ``n [L, Hkv]`` float64."""


def _save_checkpoint(path: Path, spec: FitSpec, done: int, stats: dict[str, torch.Tensor], inputs: dict[str, str] | None = None) -> None:
    from safetensors.torch import save

    from lola.io.outputs import write_files

    metadata = {"format": CHECKPOINT_FORMAT, "spec": spec.model_dump_json(), "done": str(done), "inputs": json.dumps(inputs or {})}
    body = save({k: v.contiguous() for k, v in stats.items()}, metadata=metadata)
    write_files(path.parent, {path.name: body}, ours=_is_checkpoint, writer="lola fit-scorer")


def _is_checkpoint(path: Path) -> bool:
    """Whether ``path`` holds a fit-scorer checkpoint (its format marker reads back)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return (f.metadata() or {}).get("format") == CHECKPOINT_FORMAT
    except (SafetensorError, OSError, ValueError):
        return False


def _read_checkpoint(path: Path, spec: FitSpec, inputs: dict[str, str], geometry: tuple[int, int, int] | None = None) -> tuple[int, dict[str, torch.Tensor]]:
    """``(chunks done, statistics)`` of the checkpoint at ``path``, checked against this run.

    Args:
        spec: this run's options: the saved ones must be equal.
        inputs: this run's fingerprints (``text``, and ``model`` once it is loaded): a saved
            one that differs is refused.
        geometry: ``(layers, K/V heads, features)`` of the model, once it is loaded.

    Raises:
        ValueError: naming the file and what is wrong (a damaged file, other options or
            content, statistics no fit of this model could have written).
    """
    from safetensors import SafetensorError, safe_open

    from lola.errors import describe, option_name
    from lola.io.checksums import changed_inputs

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
            if meta.get("format") != CHECKPOINT_FORMAT:
                raise ValueError(f"format {meta.get('format')!r}, expected {CHECKPOINT_FORMAT!r}")
            stats = {k: f.get_tensor(k) for k in f.keys()}
        saved = FitSpec.model_validate_json(meta["spec"])
        done = int(meta["done"])
        saved_inputs = json.loads(meta.get("inputs", "{}"))
    except (SafetensorError, OSError, KeyError, ValueError) as err:
        raise ValueError(
            f"{path} is not a readable lola fit-scorer checkpoint ({describe(err)}): it is truncated, damaged or another tool's file; "
            "move it away, or remove it to start the fit anew"
        ) from None
    if saved != spec:
        diff = [f"{option_name(k)}: saved {v!r}, now {getattr(spec, k)!r}" for k, v in saved.model_dump().items() if v != getattr(spec, k)]
        raise ValueError(f"{path} holds a fit with other settings ({'; '.join(diff)}); use the same options to resume, or remove it to start anew")
    changed = changed_inputs(saved_inputs, inputs)
    if "text" in changed:
        raise ValueError(
            f"{path} was written by a fit on other text: --text {spec.text} changed since it started (same path, other content); restore it, or remove {path.name} to start anew"
        )
    if "model" in changed:
        raise ValueError(
            f"{path} was written by a fit of other weights: --model {spec.model} now loads weights (with --feature-maps' adapters merged) that differ from "
            f"those the fit started with; use the same model, or remove {path.name} to start anew"
        )
    if not 0 <= done <= spec.documents:
        raise ValueError(f"{path} records {done} chunks done, outside 0 to --documents {spec.documents}: the file was edited; remove it to start anew")
    if sorted(stats) != list(STATISTICS):
        raise ValueError(f"{path} holds the tensors {sorted(stats)}, expected {list(STATISTICS)}: remove it to start anew")
    for key, t in stats.items():
        if t.dtype != torch.float64:
            raise ValueError(f"{path}: {key} is {t.dtype}, expected torch.float64: remove it to start anew")
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{path}: {key} holds non-finite values: remove it to start anew")
    if bool((stats["n"] < 0).any()):
        raise ValueError(f"{path}: 'n' holds negative counts: remove it to start anew")
    if geometry is not None:
        layers, hkv, f = geometry
        want = {"xtx": (layers, hkv, f, f), "xty": (layers, hkv, f), "n": (layers, hkv)}
        for key, shape in want.items():
            if tuple(stats[key].shape) != shape:
                raise ValueError(f"{path}: {key} is {list(stats[key].shape)}, a fit of this model needs {list(shape)}: remove it to start anew")
    return done, stats


def check_resume(out: str | Path, spec: FitSpec, inputs: dict[str, str] | None = None) -> None:
    """Refuse, before a model is loaded, an ``out`` whose checkpoint ``out.partial`` is a link,
    not a plain file, damaged, or of other options or text (the model's weights and the shapes
    are compared once it is loaded, by :func:`fit_scorer`)."""
    from lola.data.text import source_digest
    from lola.io.outputs import check_target

    ckpt = _checkpoint_path(Path(out))
    check_target(ckpt, writer="lola fit-scorer")
    if ckpt.exists():
        _read_checkpoint(ckpt, spec, inputs if inputs is not None else {"text": source_digest(list(spec.text))})


@torch.no_grad()
def fit_scorer(model: torch.nn.Module, tokenizer: Any, spec: FitSpec, out: str | Path, progress: bool = True, command: str = "") -> TokenScorer:
    """Fit a scorer on ``spec.documents`` chunks, measure it on ``spec.heldout`` others, write it to ``out``.

    ``out + ".partial"`` holds the statistics after every chunk; a run with the same spec resumes
    from it (and removes it when the scorer is written).

    Args:
        model: a stock transformers decoder (LoLA not applied; trained LoRA merged, if any).
        tokenizer: its tokenizer.
        spec: the fit's settings (:class:`FitSpec`).
        out: the scorer file to write.
        progress: show progress bars.
        command: recorded in the scorer's info.

    Returns:
        The fitted :class:`~lola.scorers.TokenScorer`, its held-out report in ``info["report"]``.

    Raises:
        ValueError: a checkpoint written for another spec, a LoLA-applied model, a text too short.
    """

    from tqdm.auto import tqdm

    import lola
    from lola.data.text import load_split
    from lola.io.outputs import check_target

    if getattr(model, "_lola", None) is not None:
        raise ValueError("fit_scorer needs the stock attention: call remove_lola(model) first")
    positions = getattr(model.config, "max_position_embeddings", None)
    total = spec.positions()
    if positions and total > positions:
        raise ValueError(f"length (--length) {spec.length} needs {total} positions ({spec.target} target), the model holds {positions}")
    out = Path(out)
    check_target(out, ours=lambda p: lola.scorers.is_scorer_file(p), writer="lola fit-scorer")
    ckpt = _checkpoint_path(out)
    check_target(ckpt, writer="lola fit-scorer")  # a link or a folder; the content is read below

    cfg = model.config
    layers = cfg.num_hidden_layers
    hkv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    f = 2 * head_dim + 1
    inv_freq = _inv_freq(model)
    stats = {
        "xtx": torch.zeros(layers, hkv, f, f, dtype=torch.float64),
        "xty": torch.zeros(layers, hkv, f, dtype=torch.float64),
        "n": torch.zeros(layers, hkv, dtype=torch.float64),
    }
    from lola.data.text import source_digest
    from lola.errors import about
    from lola.io.checksums import weights_digest

    # What the statistics are of, besides the options: a resume on other text or weights would mix two fits.
    inputs = {"text": source_digest(list(spec.text)), "model": weights_digest(model)}
    done = 0
    if ckpt.exists():
        done, stats = _read_checkpoint(ckpt, spec, inputs, geometry=(layers, hkv, f))
        print(f"lola fit-scorer: resuming after {done} of {spec.documents} chunks", flush=True)

    t0 = time.perf_counter()
    with about("--text"):
        train_text, held_text = load_split(list(spec.text), heldout_fraction=0.1)
        train = text_chunks(tokenizer, train_text, spec.length, spec.documents, "training")
        held = text_chunks(tokenizer, held_text, spec.length, spec.heldout, "held-out")

    def accumulate(layer: int, head: int, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor, target: torch.Tensor) -> None:
        x = token_features(k, v, pos, None if inv_freq is None else inv_freq.to(k.device)).double()
        y = target.double().clamp_min(1e-8).log()
        stats["xtx"][layer, head] += (x.T @ x).cpu()
        stats["xty"][layer, head] += (x.T @ y).cpu()
        stats["n"][layer, head] += x.shape[0]

    with recording(model):
        for i in tqdm(range(done, spec.documents), desc=f"fit ({spec.target})", initial=done, total=spec.documents, disable=not progress):
            record_targets(model, tokenizer, train[i], spec, accumulate)
            _save_checkpoint(ckpt, spec, i + 1, stats, inputs)
        weight = solve_ridge(stats["xtx"], stats["xty"], spec.ridge).float()
        info = {"model": spec.model, "target": spec.target, "spec": spec.model_dump(mode="json"), "command": command}
        scorer = TokenScorer(weight, inv_freq, info)

        per = torch.zeros(layers, hkv, 2, dtype=torch.float64)

        def measure(layer: int, head: int, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor, target: torch.Tensor) -> None:
            pred = scorer.score(layer, k[None, None].expand(1, hkv, -1, -1), v[None, None].expand(1, hkv, -1, -1), pos[None, None].expand(1, hkv, -1))[0, head]
            per[layer, head] += torch.tensor(rank_metrics(pred.cpu(), target.cpu()), dtype=torch.float64)

        for chunk in tqdm(held, desc="held-out", disable=not progress):
            record_targets(model, tokenizer, chunk, spec, measure)
    per /= len(held)
    report = {
        "heldout_chunks": len(held),
        "tokens_fitted_per_head": int(stats["n"][0, 0]),
        "spearman": [[round(float(x), 4) for x in row] for row in per[..., 0]],
        "top10_recall": [[round(float(x), 4) for x in row] for row in per[..., 1]],
        "mean_spearman": round(float(per[..., 0].mean()), 4),
        "mean_top10_recall": round(float(per[..., 1].mean()), 4),
        "seconds": round(time.perf_counter() - t0, 1),
        "versions": versions(),
    }
    scorer.info["report"] = report
    scorer.save(out)
    ckpt.unlink(missing_ok=True)
    return scorer


def format_report(report: dict) -> str:
    """Per-layer held-out fit quality (mean over K/V heads) as a plain-text table."""
    lines = [f"{'layer':>5}  {'spearman':>8}  {'top-10% recall':>14}", "-" * 33]
    for i, (rho, rec) in enumerate(zip(report["spearman"], report["top10_recall"])):
        lines.append(f"{i:>5}  {sum(rho) / len(rho):>8.3f}  {sum(rec) / len(rec):>14.3f}")
    lines.append(f"\nmean over layers and heads: spearman {report['mean_spearman']:.3f}, top-10% recall {report['mean_top10_recall']:.3f} (chance 0.100)")
    return "\n".join(lines)
