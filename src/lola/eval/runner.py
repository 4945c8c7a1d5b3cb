"""Run the needle-in-a-haystack experiment: every method on the same samples, resumable.

Methods (all but ``full`` share one exact-token budget ``sinks + window + sparse_size``):

- ``full``: stock attention and a growing cache.
- ``window``: sinks + a sliding window of the whole budget, softmax only.
- ``lolcats``: sinks + a sliding window of the whole budget + the linear state (mixed with the
  run's rule, or ``lola_authors`` when that is ``softmax_only``, which would ignore the state).
- ``lola``: sinks + window + sparse cache + linear state, once per scoring policy
  (reported as ``lola-<policy>``), with uniform or calibrated per-head budgets
  (:mod:`lola.budgets`), plus any named ``variants`` (``lola-<name>``): partial
  :class:`~lola.LoLAConfig` settings over the run's own, for comparing policies and
  allocations on the same samples.
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any, Iterable, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lola.config import LoLAConfig

__all__ = ["METHODS", "NiahRun", "format_depth_summary", "format_intervals", "format_summary", "method_configs", "plot_results", "run_niah", "summarize", "summarize_by_depth", "wilson_interval"]

METHODS = ("full", "window", "lolcats", "lola")


class NiahRun(BaseModel):
    """Everything that defines a run (saved in ``results.json``; a resumed run must match)."""

    model_config = ConfigDict(extra="forbid")

    model: str = "smollm2-135m-instruct"
    task: str = "niah_single_1"
    lengths: list[int] = Field(default_factory=lambda: [1024, 2048], min_length=1)
    samples: int = Field(5, ge=1)
    methods: list[str] = Field(default_factory=lambda: list(METHODS), min_length=1)
    policies: list[str] = Field(default_factory=lambda: ["sre"], min_length=1)
    window: int = Field(60, ge=0)
    # 4 + 60 + 192 = 256 exact tokens: S-NIAH-1 at 2K went from 1/20 with a 64-token sparse
    # cache to 14/20 with 192 (`lola niah --methods lola --lengths 2048 --samples 20 --sparse-size S`).
    sparse_size: int = Field(192, ge=0)
    sinks: int = Field(4, ge=0)
    chunk: int = Field(64, ge=1)
    # Training-free (untrained identity Hedgehog map), softmax_only recalled best: 3/4 at 1K
    # vs 0/4 with lola_authors (`lola niah --lengths 1024 --samples 4 --methods lola --mixing M`).
    # None: softmax_only, or with feature_maps the rule they were trained with.
    mixing: Literal["lolcats", "lola_authors", "softmax_only"] | None = None
    feature_maps: str | None = Field(None, description="a `lola linearize` folder, or a shipped name, loaded into every method but full")
    gqa_storage: Literal["kv_head", "query_head"] = "kv_head"
    max_new_tokens: int | None = Field(None, ge=1, description="None: 12 for number answers, 64 for uuids and vt")
    seed: int = 0
    haystack_file: str | None = None
    needle: str | None = None
    question: str | None = None
    answer_prefix: str | None = Field(None, description="with a custom question: text that starts the answer, with {key}")
    # Calibrated budgets won the tournament at the same bytes (prose 2K: 60% against 15% for
    # uniform, 20 samples; docs/results.md). "auto": the model's shipped budgets, else uniform.
    budgets: str | None = Field("auto", description="sparse budgets of the lola method: 'auto' (the model's shipped budgets, if any), 'uniform' (or None), a shipped name or a `lola calibrate` file")
    variants: dict[str, dict[str, Any]] = Field(default_factory=dict, description="extra lola variants: name -> LoLAConfig fields (and 'budgets')")

    @field_validator("task")
    @classmethod
    def _known_task(cls, task: str) -> str:
        from lola.eval.niah import TASKS

        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}; available: {', '.join(TASKS)}")
        return task

    @field_validator("haystack_file")
    @classmethod
    def _readable_haystack(cls, path: str | None) -> str | None:
        if path is not None:
            p = Path(path)
            if not p.is_file():
                raise ValueError(f"haystack file {path!r} does not exist")
            if not p.read_text(errors="replace").strip():
                raise ValueError(f"haystack file {path!r} is empty")
        return path

    @field_validator("feature_maps")
    @classmethod
    def _feature_maps_folder(cls, path: str | None) -> str | None:
        from lola.linearize.shipped import SHIPPED

        if path is not None and path not in SHIPPED and not (Path(path) / "feature_maps.safetensors").is_file():
            raise ValueError(f"{path!r} is not a feature-map folder (no feature_maps.safetensors; create it with `lola linearize --out {path}`)")
        return path

    @model_validator(mode="after")
    def _custom_needle(self) -> "NiahRun":
        if (self.needle is None) != (self.question is None):
            raise ValueError("needle and question must be given together")
        if self.needle is not None:
            for field in ("{key}", "{value}"):
                if field not in self.needle:
                    raise ValueError(f"the needle template must contain {field}, got {self.needle!r}")
            if "{key}" not in self.question:
                raise ValueError(f"the question must contain {{key}}, got {self.question!r}")
        if (self.haystack_file or self.needle) and self.task != "niah_single_1":
            raise ValueError("haystack_file, needle and question apply to niah_single_1 only")
        if self.answer_prefix is not None and self.question is None:
            raise ValueError("answer_prefix needs a custom question (the default template has its own)")
        method_configs(self)  # every variant and budget must build (errors name the field)
        return self

    @property
    def new_tokens(self) -> int:
        """Tokens generated per answer."""
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        return 64 if self.task in ("niah_multikey_3", "vt") else 12  # a uuid is ~40 SmolLM2 tokens

    @field_validator("methods")
    @classmethod
    def _known_methods(cls, methods: list[str]) -> list[str]:
        bad = [m for m in methods if m not in METHODS]
        if bad:
            raise ValueError(f"unknown methods {bad}; available: {', '.join(METHODS)}")
        return methods

    @field_validator("policies")
    @classmethod
    def _known_policies(cls, names: list[str]) -> list[str]:
        from lola import policies

        bad = [p for p in names if p not in policies.available()]
        if bad:
            raise ValueError(f"unknown policies {bad}; available: {', '.join(policies.available())}")
        return names

    @field_validator("lengths")
    @classmethod
    def _positive_lengths(cls, lengths: list[int]) -> list[int]:
        if any(n < 64 for n in lengths):
            raise ValueError(f"lengths must be >= 64 tokens, got {lengths}")
        return lengths

    @property
    def budget(self) -> int:
        """Exact tokens of every method but ``full``."""
        return self.sinks + self.window + self.sparse_size


def _with_budgets(cfg: LoLAConfig, budgets: str | None, model: str) -> LoLAConfig:
    """``cfg`` with the named budgets applied; ``"auto"``: the shipped budgets of ``model`` if
    there are any, else uniform."""
    from lola import budgets as head_budgets

    if budgets == "auto":
        budgets = model if model in head_budgets.available() else None
    if budgets is None or budgets == "uniform":
        return cfg
    return head_budgets.load(budgets).apply(cfg)


def method_configs(run: NiahRun) -> dict[str, LoLAConfig | None]:
    """``{method name: LoLA config}`` (``None`` = stock attention) for the run's methods."""
    common = dict(sinks=run.sinks, chunk=run.chunk, gqa_storage=run.gqa_storage)
    wide = run.window + run.sparse_size  # the window-only methods get the whole budget
    # With trained feature maps an unset mixing rule is left to the maps (apply_lola fills it in).
    if run.feature_maps is None:
        lola_mixing = {"mixing": run.mixing or "softmax_only"}
        hybrid_mixing = {"mixing": "lola_authors" if lola_mixing["mixing"] == "softmax_only" else lola_mixing["mixing"]}
    else:
        lola_mixing = {"mixing": run.mixing} if run.mixing else {}
        hybrid_mixing = {}
    out: dict[str, LoLAConfig | None] = {}
    for method in run.methods:
        if method == "full":
            out["full"] = None
        elif method == "window":
            out["window"] = LoLAConfig(window=wide, sparse_size=0, mixing="softmax_only", **common)
        elif method == "lolcats":
            out["lolcats"] = LoLAConfig(window=wide, sparse_size=0, **hybrid_mixing, **common)
        else:
            base = dict(window=run.window, sparse_size=run.sparse_size, **lola_mixing, **common)
            for policy in run.policies:
                out[f"lola-{policy}"] = _with_budgets(LoLAConfig(policy=policy, **base), run.budgets, run.model)
            for name, fields in run.variants.items():
                fields = dict(fields)
                budgets = fields.pop("budgets", None)
                try:
                    out[f"lola-{name}"] = _with_budgets(LoLAConfig(**{**base, **fields}), budgets, run.model)
                except ValueError as err:
                    raise ValueError(f"variant {name!r}: {err}") from None
    return out


def wilson_interval(hits: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of an accuracy of ``hits`` out of ``n``, in percent."""
    if n <= 0:
        raise ValueError(f"n must be > 0, got {n}")
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / (1 + z * z / n)
    return 100.0 * max(0.0, centre - half), 100.0 * min(1.0, centre + half)


def _load_done(path: Path) -> dict[tuple[str, int, int], dict]:
    done: dict[tuple[str, int, int], dict] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                done[(rec["method"], rec["length"], rec["index"])] = rec
    return done


def _cache_bytes(cache: Any) -> int:
    if hasattr(cache, "nbytes"):
        return int(cache.nbytes())
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values) if t is not None)


def run_niah(run: NiahRun, model: Any, tokenizer: Any, out_dir: str | Path, progress: bool = True, batch_size: int = 1) -> list[dict]:
    """Run (or resume) ``run`` on ``model``; returns every sample's record.

    Records are appended to ``out_dir/samples.jsonl`` as they finish, so an interrupted run
    continues where it stopped when called again with the same ``out_dir``;
    ``out_dir/results.json`` holds the run, versions and the summary.

    Args:
        batch_size: samples of one length generated together as one left-padded batch
            (greedy decoding; each row's answer is the same as alone, up to float rounding).
    """
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    from tqdm.auto import tqdm
    from transformers import DynamicCache

    from lola.eval.niah import make_sample, string_match_all
    from lola.integrations.transformers import LoLACache, apply_lola, remove_lola

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    if results_path.exists():
        saved = json.loads(results_path.read_text()).get("run")
        if saved is not None and NiahRun(**saved) != run:
            raise ValueError(f"{out} holds a different run; use another --out or the same options (saved: {saved})")
    _write_results(results_path, run, [])
    samples_path = out / "samples.jsonl"
    done = _load_done(samples_path)
    configs = method_configs(run)
    depths = [(i + 0.5) / run.samples for i in range(run.samples)]
    haystack = Path(run.haystack_file).read_text(errors="replace") if run.haystack_file else None
    prompts = {
        (n, i): make_sample(tokenizer, run.task, n, d, seed=run.seed * 100_003 + i, max_new_tokens=run.new_tokens, haystack=haystack, needle=run.needle, question=run.question, answer_prefix=run.answer_prefix)
        for n in run.lengths
        for i, d in enumerate(depths)
    }
    max_positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if max_positions and max(run.lengths) > max_positions:
        raise ValueError(f"length {max(run.lengths)} exceeds what the model can hold ({max_positions} positions)")
    todo = [(m, n, i) for m in configs for n in run.lengths for i in range(run.samples) if (m, n, i) not in done]
    bar = tqdm(total=len(configs) * len(prompts), initial=len(configs) * len(prompts) - len(todo), desc="niah", disable=not progress)
    records = list(done.values())
    pad_id = getattr(tokenizer, "pad_token_id", None)
    pad_id = getattr(tokenizer, "eos_token_id", None) if pad_id is None else pad_id
    if batch_size > 1 and pad_id is None:
        raise ValueError("batch_size > 1 needs a tokenizer with a pad or eos token id")
    with open(samples_path, "a") as log:
        for method, cfg in configs.items():
            mine = [(n, i) for (m, n, i) in todo if m == method]
            if not mine:
                continue
            if cfg is not None:
                apply_lola(model, cfg, feature_maps=run.feature_maps)
            try:
                for batch in _batches(mine, batch_size):
                    samples = [prompts[key] for key in batch]
                    ids, mask, width = _left_pad([s.input_ids[0] for s in samples], pad_id)
                    cache = DynamicCache() if cfg is None else LoLACache(model)
                    t0 = time.perf_counter()
                    with torch.no_grad():
                        out_ids = model.generate(ids, attention_mask=mask, max_new_tokens=run.new_tokens, do_sample=False, cache=cache, pad_token_id=pad_id)
                    seconds = (time.perf_counter() - t0) / len(batch)
                    cache_bytes = _cache_bytes(cache)
                    for row, ((n, i), s) in enumerate(zip(batch, samples)):
                        prediction = tokenizer.decode(out_ids[row, width:], skip_special_tokens=True)
                        tokens = s.length + out_ids.shape[1] - width
                        # A stock cache holds every row padded to the longest: count this row's share.
                        share = 1 / len(batch) if cfg is not None else tokens / (len(batch) * out_ids.shape[1])
                        rec = {
                            "method": method, "length": n, "index": i, "depth": s.depth, "prompt_tokens": s.length,
                            "answers": s.answers, "prediction": prediction, "score": string_match_all(prediction, s.answers),
                            "cache_bytes": round(cache_bytes * share), "seconds": seconds,
                            "tokens_per_second": tokens / seconds,
                        }
                        log.write(json.dumps(rec) + "\n")
                        log.flush()
                        records.append(rec)
                        bar.update(1)
            finally:
                if cfg is not None:
                    remove_lola(model)
    bar.close()
    _write_results(results_path, run, records)
    plot_results(records, out)
    return records


def _batches(items: list[tuple[int, int]], size: int) -> list[list[tuple[int, int]]]:
    """Consecutive groups of at most ``size`` samples, never mixing lengths."""
    out: list[list[tuple[int, int]]] = []
    for item in items:
        if out and len(out[-1]) < size and out[-1][0][0] == item[0]:
            out[-1].append(item)
        else:
            out.append([item])
    return out


def _left_pad(rows: list[torch.Tensor], pad_id: int | None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``[B, T]`` left-padded ids, the ``[B, T]`` attention mask and ``T``."""
    width = max(r.shape[0] for r in rows)
    ids = torch.full((len(rows), width), 0 if pad_id is None else pad_id, dtype=rows[0].dtype)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - r.shape[0] :] = r
        mask[i, width - r.shape[0] :] = 1
    return ids, mask, width


def summarize(records: Iterable[dict]) -> dict[str, dict[int, dict[str, float]]]:
    """``{method: {length: {"accuracy": %, "low": %, "high": %, "cache_bytes": mean, "samples": n}}}``
    (``low``–``high``: the 95% Wilson interval of the accuracy)."""
    table: dict[str, dict[int, list[dict]]] = {}
    for r in records:
        table.setdefault(r["method"], {}).setdefault(r["length"], []).append(r)
    out: dict[str, dict[int, dict[str, float]]] = {}
    for m, by in table.items():
        out[m] = {}
        for n, rs in sorted(by.items()):
            hits = sum(r["score"] for r in rs)
            low, high = wilson_interval(hits, len(rs))
            out[m][n] = {"accuracy": 100.0 * hits / len(rs), "low": low, "high": high, "cache_bytes": sum(r["cache_bytes"] for r in rs) / len(rs), "samples": len(rs)}
    return out


def summarize_by_depth(records: Iterable[dict], buckets: int = 5) -> dict[str, dict[str, float]]:
    """``{method: {"0.0-0.2": accuracy %, …}}`` over all lengths, by needle depth."""
    table: dict[str, dict[int, list[float]]] = {}
    for r in records:
        b = min(int(r["depth"] * buckets), buckets - 1)
        table.setdefault(r["method"], {}).setdefault(b, []).append(r["score"])
    return {m: {f"{b / buckets:.1f}-{(b + 1) / buckets:.1f}": 100.0 * sum(v) / len(v) for b, v in sorted(by.items())} for m, by in table.items()}


def format_depth_summary(by_depth: dict[str, dict[str, float]]) -> str:
    """Accuracy per method × depth bucket as a plain-text table."""
    cols = sorted({c for by in by_depth.values() for c in by})
    head = f"{'method':<16}" + "".join(f"{c:>10}" for c in cols)
    lines = [head, "-" * len(head)]
    for m, by in by_depth.items():
        lines.append(f"{m:<16}" + "".join(f"{by[c]:>9.1f}%" if c in by else f"{'':>10}" for c in cols))
    return "\n".join(lines)


def plot_results(records: list[dict], out_dir: str | Path) -> list[Path]:
    """Write ``accuracy.png`` (accuracy vs length) and ``cache_bytes.png`` (cache MiB vs length)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = summarize(records)
    paths = []
    for name, key, ylabel, scale in (("accuracy.png", "accuracy", "accuracy (%)", 1.0), ("cache_bytes.png", "cache_bytes", "cache (MiB)", 2.0**-20)):
        fig, ax = plt.subplots(figsize=(6, 4))
        for method, by in summary.items():
            lengths = sorted(by)
            ys = [by[n][key] * scale for n in lengths]
            if key == "accuracy":  # 95% Wilson intervals
                err = [[y - by[n]["low"] for y, n in zip(ys, lengths)], [by[n]["high"] - y for y, n in zip(ys, lengths)]]
                ax.errorbar(lengths, ys, yerr=err, marker="o", capsize=3, label=method)
            else:
                ax.plot(lengths, ys, marker="o", label=method)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = Path(out_dir) / name
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


def _table(summary: dict[str, dict[int, dict[str, float]]], cell: Any, width: int) -> str:
    lengths = sorted({n for by in summary.values() for n in by})
    head = f"{'method':<16}" + "".join(f"{n:>{width}}" for n in lengths)
    lines = [head, "-" * len(head)]
    for m, by in summary.items():
        lines.append(f"{m:<16}" + "".join(cell(by[n]) if n in by else " " * width for n in lengths))
    return "\n".join(lines)


def format_summary(summary: dict[str, dict[int, dict[str, float]]]) -> str:
    """Accuracy (and cache MiB) per method × length as a plain-text table."""
    return _table(summary, lambda c: f"{c['accuracy']:>7.1f}% {c['cache_bytes'] / 2**20:>6.1f}MiB", 16)


def format_intervals(summary: dict[str, dict[int, dict[str, float]]]) -> str:
    """Accuracy with its 95% Wilson interval and the sample count, per method × length."""
    return _table(summary, lambda c: f"{c['accuracy']:>6.1f}% [{c['low']:>3.0f}-{c['high']:>3.0f}] n={c['samples']:<3}", 22)


def _write_results(path: Path, run: NiahRun, records: list[dict]) -> None:
    import transformers

    import lola

    payload = {
        "run": run.model_dump(),
        "versions": {"lola": lola.__version__, "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version()},
        "methods": {m: (None if c is None else c.model_dump(mode="json")) for m, c in method_configs(run).items()},
        "summary": {m: {str(n): v for n, v in by.items()} for m, by in summarize(records).items()},
        "summary_by_depth": summarize_by_depth(records),
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=2))
    tmp.replace(path)
