"""Held-out perplexity of full attention, the linearized hybrid and LoLA at given context lengths.

Each context length ``L`` cuts the held-out token stream into non-overlapping windows of ``L``
tokens; a method's perplexity is ``exp`` of the mean next-token negative log-likelihood over
every predicted token of every window (``L − 1`` per window), one forward pass per window.

Each LoLA method also reports the share of its layers' outputs that comes from the linear
state (:mod:`lola.eval.linear_share`), per layer, measured on the same windows.

Perplexity hides generation failures, so each method also continues the first
``generate_windows`` windows of every length greedily for ``generate`` tokens, and the report
gives the repeated 4-gram rate of those continuations (:mod:`lola.eval.generation`) beside
full attention's on the same prompts.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator, model_validator

from lola.config import MAX_TOKENS, LoLAConfig, Tokens, validation_summary
from lola.core.mixing import MIXING_NAMES
from lola.data.text import TextOption
from lola.methods import (
    METHODS,
    ExactDistanceOption,
    LinearDecayOption,
    LinearShareCapFromOption,
    LinearShareCapOption,
    PositionsOption,
    PrefillChunkOption,
    StateKeyPositionsOption,
    StatePositionsOption,
    holds_length,
    linear_state_options,
    method_config,
    method_name,
    position_options,
)
from lola.pretrained.resolve import resolve_config, run_config

__all__ = ["PerplexityRun", "PPL_METHODS", "format_perplexity", "perplexity_configs", "run_perplexity", "window_nll"]

PPL_METHODS = tuple(m for m in METHODS if m != "window")
"""The methods of :data:`lola.methods.METHODS` that ``lola perplexity`` measures (all but ``window``)."""


class PerplexityRun(BaseModel):
    """Options of ``lola perplexity``."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    model: str = Field("smollm2-135m-instruct", description="registered name, .gguf file or Hugging Face folder")
    lengths: list[Annotated[StrictInt, Field(ge=2, le=MAX_TOKENS)]] = Field(
        default_factory=lambda: [1024, 2048], min_length=1, description="context lengths (tokens per window)"
    )
    methods: list[str] = Field(default_factory=lambda: list(PPL_METHODS), min_length=1, description=f"methods to measure: any of {', '.join(PPL_METHODS)}")
    feature_maps: str | None = Field(None, description="a `lola linearize` folder or shipped name; none: untrained maps")
    window: Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)] = Field(64, description="sliding window of the hybrid and of lola")
    sparse_size: Tokens = Field(64, description="sparse cache of the lola method (per K/V head, the average with budgets)")
    # LoLAConfig's default: sinks lowered the shipped linearized hybrid's perplexity more than any
    # mixing rule (docs/results.md, "The paper's rule: LoLA on the shipped hybrid, measured to the end").
    sinks: Tokens = Field(4, description="pinned first tokens")
    chunk: Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)] = Field(64, description="tokens between select-and-evict steps")
    prefill_chunk: PrefillChunkOption = None
    policy: str = Field("sre", description="scoring policy of the lola method")
    linear_decay: LinearDecayOption = None
    linear_share_cap: LinearShareCapOption = None
    linear_share_cap_from: LinearShareCapFromOption = None
    positions: PositionsOption = None
    exact_distance: ExactDistanceOption = None
    state_positions: StatePositionsOption = None
    state_key_positions: StateKeyPositionsOption = None
    mixing: Literal[MIXING_NAMES] | None = Field(
        None, description="mixing rule of the lola method; none: the paper's lola_authors (with trained maps: lola.pretrained.resolve's default, the same)"
    )
    # Uniform by default: the perplexities in docs/results.md ("Perplexity at every length" and the
    # sections before it) were measured with uniform sizes.
    budgets: str = Field(
        "uniform",
        description="per-head sparse budgets of the lola method: uniform, auto (budgets calibrated for the feature maps, else the model's shipped ones), a shipped name or a `lola calibrate` file",
    )
    windows: StrictInt = Field(4, ge=1, le=1_000_000, description="held-out windows per length (at most)")
    generate: StrictInt = Field(
        64, ge=0, le=MAX_TOKENS, description="greedy tokens generated after each of the first generate_windows windows (0: no generation check)"
    )
    generate_windows: StrictInt = Field(2, ge=1, le=1_000_000, description="windows per length continued for the repetition check")
    text: TextOption = Field(None, description="files, folders or corpus names whose last tenth is held out; none: the default corpus")

    heldout_fraction: float = Field(0.1, gt=0, lt=1)

    @field_validator("methods", mode="before")
    @classmethod
    def _todays_names(cls, values: object) -> object:
        return [method_name(v) if isinstance(v, str) else v for v in values] if isinstance(values, list) else values

    @field_validator("methods")
    @classmethod
    def _known(cls, methods: list[str]) -> list[str]:
        unknown = [m for m in methods if m not in PPL_METHODS]
        if unknown:
            raise ValueError(f"unknown methods {unknown}; available: {', '.join(PPL_METHODS)}")
        return methods

    @field_validator("lengths", "methods")
    @classmethod
    def _distinct(cls, values: list, info) -> list:
        repeated = sorted({v for v in values if values.count(v) > 1}, key=str)
        if repeated:
            raise ValueError(f"{info.field_name} must be distinct, got {values} ({', '.join(map(str, repeated))} more than once)")
        return values

    @model_validator(mode="after")
    def _configs_build(self) -> "PerplexityRun":
        try:
            perplexity_configs(self)  # e.g. an unknown policy, named here rather than after loading
        except ValidationError as err:
            raise ValueError(validation_summary(err)) from None
        return self


def perplexity_configs(run: PerplexityRun) -> dict[str, LoLAConfig | None]:
    """``{method: LoLA config}`` (``None`` = stock attention), built by :func:`lola.methods.method_config`:
    ``hybrid`` is the hybrid (window + linear state, the window of ``lola``), ``lola`` adds the
    sparse cache, with ``run.budgets`` applied by :func:`lola.pretrained.resolve.resolve_config`. Mixing: ``run.mixing`` for ``lola``; left unset, with trained maps
    :func:`lola.pretrained.resolve.resolve_mixing` decides (``lola_authors`` for ``lola``, the trained rule
    for the hybrid), without them both use ``lola_authors``."""
    trained = run.feature_maps is not None
    configs = {}
    for method in run.methods:
        cfg = method_config(
            method,
            window=run.window,
            sparse_size=run.sparse_size,
            sinks=run.sinks,
            chunk=run.chunk,
            prefill_chunk=run.prefill_chunk,
            policy=run.policy,
            mixing=run.mixing if run.mixing is not None or trained else "lola_authors",
            trained_maps=trained,
            hybrid_window="window",
            overrides={**position_options(run), **(linear_state_options(run) if method == "lola" else {})} or None,
        )
        # The per-head budgets redistribute the sparse cache: the lola method's alone.
        configs[method] = resolve_config(cfg, model=run.model, budgets=run.budgets, maps_to_apply=run.feature_maps) if method == "lola" else cfg
    return configs


def _check_methods(model: Any, configs: dict[str, LoLAConfig | None], maps: Any) -> None:
    """Apply (and remove) every LoLA config of ``configs`` once, with the read feature ``maps``
    (or ``None``), so that whatever :func:`~lola.integrations.transformers.apply_lola` refuses
    (the architecture, feature maps that do not fit the model or a config) is refused before any
    work."""
    from lola.integrations.transformers import apply_lola, remove_lola

    for cfg in configs.values():
        if cfg is not None:
            apply_lola(model, cfg, feature_maps=maps)
            remove_lola(model)


# Config fields with which a causal LM changes its logits after the output projection
# (Gemma 2's soft-capping, Cohere's scale, Granite's divisor): such a model's logits come from
# its own forward, never from the projection alone.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def _plain_output_head(model: Any) -> tuple[Any, Any] | None:
    """``(decoder, head)`` when ``model``'s logits are ``head(decoder(...).last_hidden_state)``
    and nothing else, ``None`` otherwise."""
    config = getattr(model, "config", None)
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in _LOGIT_TRANSFORMS):
        return None
    get_decoder = getattr(model, "get_decoder", None)
    get_head = getattr(model, "get_output_embeddings", None)
    if get_decoder is None or get_head is None:
        return None
    decoder, head = get_decoder(), get_head()
    return (decoder, head) if decoder is not None and isinstance(head, torch.nn.Linear) else None


@torch.no_grad()
def window_nll(model: Any, ids: torch.Tensor, cache: Any = None, logits_chunk: int = 4096) -> tuple[float, int]:
    """Summed next-token NLL over one window ``ids [1, L]`` and the number of predicted tokens.

    The logits are made ``logits_chunk`` positions at a time from the decoder's last hidden
    states ``[1, L, d]``: a whole window's ``[L, V]`` logits grow with the window (about 13 GB in
    float32 at 65,536 tokens for a 49,152-token vocabulary) where the hidden states are ``V / d``
    times smaller. Models that transform their logits after the projection go through their own
    forward, whole.
    """
    if logits_chunk < 1:
        raise ValueError(f"logits_chunk must be a positive number of positions, got {logits_chunk}")
    targets = ids[0, 1:]
    parts = _plain_output_head(model)
    if parts is None:
        logits = model(ids, cache=cache, use_cache=cache is not None).logits[0, :-1].float()
        return float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum")), ids.shape[1] - 1
    decoder, head = parts
    hidden = decoder(ids, cache=cache, use_cache=cache is not None).last_hidden_state[0, :-1]
    nll = 0.0
    for start in range(0, hidden.shape[0], logits_chunk):
        logits = head(hidden[start : start + logits_chunk]).float()
        nll += float(torch.nn.functional.cross_entropy(logits, targets[start : start + logits_chunk], reduction="sum"))
    return nll, ids.shape[1] - 1


def run_perplexity(run: PerplexityRun, model: Any, tokenizer: Any, progress: bool = True) -> dict[str, dict[int, dict[str, float]]]:
    """``{method: {length: {"ppl": …, "tokens": …, "windows": …}}}`` on the held-out split."""
    from tqdm.auto import tqdm

    from lola.data.text import describe, encode, load_split
    from lola.eval.generation import greedy_continuation, repeated_ngram_rate
    from lola.eval.linear_share import LinearShareMeter
    from lola.integrations.transformers import LoLACache, apply_lola, remove_lola

    max_positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    configs = perplexity_configs(run)
    maps = None
    if run.feature_maps is not None and any(c is not None for c in configs.values()):
        from lola.pretrained.folder import read_feature_maps

        maps = read_feature_maps(run.feature_maps)
    # Full attention, and LoLA with absolute positions (the configs as they will run, the maps'
    # read defaults included), cannot read past the model's context: their cells there are
    # refused (shown so); a length no method can read is refused before any work.
    refused = {(m, n) for m, c in configs.items() for n in run.lengths if not holds_length(run_config(c, maps, max_positions), n + run.generate, max_positions)}
    for n in run.lengths:  # before the text is read and encoded
        if all((m, n) in refused for m in configs):
            if not holds_length(None, n, max_positions):
                raise ValueError(
                    f"length {n} exceeds what the model can hold ({max_positions} positions) and no method bounds its positions: give --positions bounded or shorter --lengths"
                )
            raise ValueError(
                f"--generate {run.generate} after a window of length {n} reaches position {n + run.generate}, beyond the model's {max_positions} positions; "
                f"give --generate at most {max_positions - n}, or --positions bounded"
            )
    _, heldout = load_split(run.text, run.heldout_fraction)
    ids = encode(tokenizer, heldout)
    longest = max(run.lengths)
    if ids.numel() < longest:
        raise ValueError(
            f"--text {describe(run.text)}: its held-out part (the last {run.heldout_fraction:.0%}) has {ids.numel()} tokens, fewer than one window "
            f"of --lengths {longest}; give a text of about {round(longest / run.heldout_fraction)} tokens or more, or shorter --lengths"
        )
    if "lola" in configs and run.budgets not in ("uniform", "auto"):  # "auto" only applies budgets made for the model
        from lola import budgets as head_budgets
        from lola.errors import about
        from lola.pretrained.folder import model_geometry

        geometry = model_geometry(model)
        with about(f"--budgets {run.budgets}"):
            head_budgets.load(run.budgets).check_geometry(geometry["num_layers"], geometry["num_kv_heads"])
    _check_methods(model, configs, maps)  # before the bar: an error under it would print on the bar's line
    device = next(model.parameters()).device
    jobs = [(m, n, w) for m in configs for n in run.lengths for w in range(min(run.windows, ids.numel() // n)) if (m, n) not in refused]
    gen_jobs = sum(1 for m, n, w in jobs if run.generate and w < run.generate_windows)
    bar = tqdm(total=len(jobs) + gen_jobs, desc="perplexity", disable=not progress)
    sums: dict[tuple[str, int], list[float]] = {}
    repeats: dict[tuple[str, int], list[float]] = {}
    shares: dict[tuple[str, int], LinearShareMeter] = {}
    ran: dict[str, LoLAConfig | None] = {}
    for method, cfg in configs.items():
        if cfg is not None:
            apply_lola(model, cfg, feature_maps=maps)
            ran[method] = model._lola.config  # after trained maps filled in their fields
        else:
            ran[method] = None
        try:
            for m, n, w in jobs:
                if m != method:
                    continue
                window = ids[w * n : (w + 1) * n].view(1, n).to(device)
                if cfg is None:
                    nll, count = window_nll(model, window)
                else:
                    meter = shares.setdefault((method, n), LinearShareMeter(model._lola.modules))
                    with meter:
                        nll, count = window_nll(model, window, LoLACache(model))
                acc = sums.setdefault((method, n), [0.0, 0, 0])
                acc[0] += nll
                acc[1] += count
                acc[2] += 1
                bar.update(1)
                if run.generate and w < run.generate_windows:
                    cont = greedy_continuation(model, window, run.generate, (lambda: LoLACache(model)) if cfg is not None else None)
                    repeats.setdefault((method, n), []).append(repeated_ngram_rate(cont, 4))
                    bar.update(1)
        finally:
            if cfg is not None:
                remove_lola(model)
    bar.close()
    results: dict[str, dict[int, dict[str, float]]] = {}
    for m in configs:
        results[m] = {}
        for n in run.lengths:
            if (m, n) in refused:
                results[m][n] = {"refused": f"past the model's {max_positions} positions"}
                continue
            total, count, windows = sums[(m, n)]
            cell = {"ppl": math.exp(total / count), "tokens": count, "windows": windows}
            if (m, n) in repeats:
                cell["repeat4"] = sum(repeats[(m, n)]) / len(repeats[(m, n)])
            if (m, n) in shares:
                meter = shares[(m, n)]
                cell["linear_share"] = meter.mean()
                cell["linear_share_per_layer"] = meter.per_layer()
                cell["mixing"] = ran[m].mixing
            results[m][n] = cell
    return results


def format_perplexity(results: dict[str, dict[int, dict[str, float]]]) -> str:
    """A text table: perplexity per method × length, the ratio to ``full`` when present, the
    repeated 4-gram rate of the greedy continuations when measured, and the linear state's share
    of the outputs (mean over layers, then per layer)."""
    lengths = sorted({n for per in results.values() for n in per})
    head = f"{'method':<12}" + "".join(f"{n:>16}" for n in lengths)
    lines = [head, "-" * len(head)]
    full = results.get("full")
    for m, per in results.items():
        cells = []
        for n in lengths:
            if "refused" in per[n]:
                cells.append("refused".rjust(16))
                continue
            ppl = per[n]["ppl"]
            ratio = f" ({ppl / full[n]['ppl']:.2f}x)" if full and m != "full" and "ppl" in full[n] else ""
            cells.append(f"{ppl:.2f}{ratio}".rjust(16))
        lines.append(f"{m:<12}" + "".join(cells))
    if any("repeat4" in c for per in results.values() for c in per.values()):
        lines += ["", "repeated 4-grams in greedy continuations (0 = none; compare with full)", head, "-" * len(head)]
        for m, per in results.items():
            lines.append(f"{m:<12}" + "".join(f"{per[n]['repeat4']:.2f}".rjust(16) if "repeat4" in per[n] else " " * 16 for n in lengths))
    with_shares = {m: per for m, per in results.items() if any("linear_share" in c for c in per.values())}
    if with_shares:
        lines += ["", "share of the outputs from the linear state (mean over layers and tokens; 0 = exact tokens only)", head, "-" * len(head)]
        for m, per in with_shares.items():
            rule = next(c["mixing"] for c in per.values() if "mixing" in c)
            lines.append(
                f"{m:<12}" + "".join(f"{per[n]['linear_share']:.3f}".rjust(16) if "linear_share" in per[n] else " " * 16 for n in lengths) + f"   ({rule})"
            )
        for n in lengths:
            layers = sorted({int(i) for per in with_shares.values() for i in per[n].get("linear_share_per_layer", {})})
            lines += ["", f"per layer at {n} tokens (percent)", f"{'layer':<12} " + " ".join(f"{i:>3}" for i in layers)]
            for m, per in with_shares.items():
                by_layer = {int(i): x for i, x in per[n].get("linear_share_per_layer", {}).items()}
                lines.append(f"{m:<12} " + " ".join(f"{100 * by_layer[i]:3.0f}" if i in by_layer else "   " for i in layers))
    return "\n".join(lines)
