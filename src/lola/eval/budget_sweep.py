"""Recall against bytes: pass-key accuracy as the exact-token budget grows, at every length.

``lola sweep`` runs ``lola niah`` once per (haystack, length, budget) point, each in a folder of
its own (resumable, as ``lola niah`` is), with four methods at the same exact tokens per K/V
head: a sliding window (``window``), the window + linear hybrid (``hybrid``), LoLA
(``lola-<policy>``) and LoLA's exact tokens read alone (``lola-exact``: the same config,
``softmax_only``). A budget is a fraction of the length (``1/32``: 256 exact tokens at 8K) or
``paper``: the LoLA authors' footprint per K/V head (their η = λ = 256 per query head, with 3
query heads per K/V head as on SmolLM2: a 256-token window and up to 768 sparse tokens; here 4
sinks + a 252-token window + 768 sparse slots). The points are gathered into ``sweep.json``
(accuracy with 95% Wilson intervals, cache bytes) and plotted against the exact tokens,
one figure per haystack and a panel per length. A point whose run equals an earlier point's (at
8K, 1/8 of the context is the paper's footprint) starts from that point's samples instead of
generating them again.
"""

from __future__ import annotations

import json
import shutil
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

from lola.config import Tokens
from lola.eval.demo import Seed
from lola.io.provenance import versions

__all__ = ["BudgetSweep", "PAPER_FOOTPRINT", "format_sweep", "point_run", "run_sweep"]

PAPER_FOOTPRINT = {"sinks": 4, "window": 252, "sparse_size": 768}
"""The ``paper`` budget: the LoLA authors' exact tokens per K/V head on SmolLM2's geometry."""
SWEEP_FILE = "sweep.json"
SWEEP_FORMAT = "lola-budget-sweep"


class BudgetSweep(BaseModel):
    """Options of ``lola sweep``."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    model: str = Field("smollm2-135m-instruct", description="registered name, .gguf file or Hugging Face folder")
    feature_maps: str | None = Field("auto", description="as lola niah's: auto (the model's shipped maps if any), none, a folder or a shipped name")
    lengths: list[StrictInt] = Field(default_factory=lambda: [2048, 4096, 8192], min_length=1, description="context lengths in tokens")
    budgets: list[str] = Field(
        default_factory=lambda: ["1/32", "1/16", "1/8", "paper"],
        min_length=1,
        description="exact tokens per K/V head: fractions of the length, or paper (4 sinks + a 252-token window + 768 sparse slots)",
    )
    haystacks: list[Literal["noise", "prose"]] = Field(
        default_factory=lambda: ["noise", "prose"], min_length=1, description="noise (RULER's sentences) or prose (Python's documentation, pydoc_data)"
    )
    samples: StrictInt = Field(20, ge=1, le=1_000_000, description="samples per point, at evenly spread depths")
    policy: str | None = Field(
        None, description="scoring policy of the lola methods (none: lola niah's default for the model: learned where a scorer ships, else sre)"
    )
    sinks: Tokens = Field(4, description="pinned first tokens of every method")
    seed: Seed = Field(0, description="seed of the samples")

    @field_validator("lengths")
    @classmethod
    def _lengths(cls, lengths: list[int]) -> list[int]:
        from lola.eval.niah_spec import NiahRun

        NiahRun(lengths=lengths, feature_maps=None)  # lola niah's checks, before any model loads
        return lengths

    @field_validator("budgets")
    @classmethod
    def _known_budgets(cls, budgets: list[str]) -> list[str]:
        for b in budgets:
            if b == "paper":
                continue
            try:
                f = Fraction(b)
            except (ValueError, ZeroDivisionError):
                raise ValueError(f"budgets must be fractions of the length like 1/16, or paper; got {b!r}") from None
            if not 0 < f <= 1:
                raise ValueError(f"budget fractions must lie in (0, 1], got {b!r}")
        if len(set(budgets)) != len(budgets):
            raise ValueError(f"budgets must be distinct, got {budgets}")
        spellings: dict[Any, list[str]] = {}
        for b in budgets:  # 1/4 and 2/8 are one budget: its points would run (and count) twice
            spellings.setdefault(b if b == "paper" else Fraction(b), []).append(b)
        twice = [" and ".join(names) for names in spellings.values() if len(names) > 1]
        if twice:
            raise ValueError(f"budgets must be distinct, got {budgets}: {'; '.join(twice)} are one budget written twice")
        return budgets


def _sizes(sweep: BudgetSweep, length: int, budget: str) -> dict[str, int]:
    """``sinks``, ``window`` and ``sparse_size`` of LoLA at one point: a quarter of the exact tokens
    in sinks + window, the rest sparse (``lola niah``'s 4 + 60 + 192 = 256)."""
    if budget == "paper":
        return dict(PAPER_FOOTPRINT)
    exact = round(Fraction(budget) * length)
    window = max(1, exact // 4 - sweep.sinks)
    sparse = exact - sweep.sinks - window
    if sparse < 0:
        raise ValueError(f"budgets: {budget} of {length} tokens ({exact} exact) leaves no room beside {sweep.sinks} sinks and a window")
    return {"sinks": sweep.sinks, "window": window, "sparse_size": sparse}


def point_run(sweep: BudgetSweep, haystack: str, length: int, budget: str, prose_file: str | None = None) -> Any:
    """The :class:`~lola.eval.niah_spec.NiahRun` of one point (``prose_file``: the prose haystack)."""
    from lola.eval.niah_spec import NiahRun, policy_fields

    base = NiahRun(model=sweep.model, feature_maps=sweep.feature_maps, methods=["lola"], policies=None if sweep.policy is None else [sweep.policy])
    policy = base.policies[-1]  # the learned scorer where one ships (sre otherwise, or the sweep's)
    # the lola method's scoring exactly (repeats folded where the run folds them), read alone
    exact = {"mixing": "softmax_only", **policy_fields(policy, base), "budgets": "auto"}
    return NiahRun(
        model=sweep.model,
        feature_maps=base.feature_maps,
        lengths=[length],
        samples=sweep.samples,
        seed=sweep.seed,
        methods=["window", "hybrid", "lola"],
        policies=[policy],
        haystack_file=prose_file if haystack == "prose" else None,
        variants={"exact": exact},
        **_sizes(sweep, length, budget),
    )


def is_sweep_file(path: Path) -> bool:
    """Whether ``path`` holds a ``sweep.json`` that ``lola sweep`` wrote (and may replace)."""
    from lola.io.outputs import read_json

    try:
        data = read_json(Path(path), "a lola sweep file")
    except (ValueError, OSError):
        return False
    return isinstance(data, dict) and data.get("format") == SWEEP_FORMAT


def _label(budget: str) -> str:
    return budget.replace("/", "-")


def run_sweep(sweep: BudgetSweep, model: Any, tokenizer: Any, out_dir: str | Path, progress: bool = True, batch_size: int = 1) -> list[dict]:
    """Run (or resume) every point of ``sweep``; returns the rows of ``sweep.json``. One run per
    folder (:func:`lola.io.outputs.run_lock`)."""
    from lola.io.outputs import run_lock

    with run_lock(out_dir, "lola sweep"):
        return _run_sweep(sweep, model, tokenizer, out_dir, progress, batch_size)


def _run_sweep(sweep: BudgetSweep, model: Any, tokenizer: Any, out_dir: str | Path, progress: bool, batch_size: int) -> list[dict]:
    from lola.eval.niah_execution import run_niah
    from lola.eval.niah_report import summarize
    from lola.io.figures import check_figures
    from lola.io.outputs import check_target, write_files

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    check_target(out / SWEEP_FILE, is_sweep_file, "lola sweep")  # another tool's sweep.json: refused before any point runs
    check_figures(out, [f"sweep-{h}.png" for h in sweep.haystacks], SWEEP_FILE, "lola sweep")
    _check_same_sweep(out / SWEEP_FILE, sweep)
    prose = None
    if "prose" in sweep.haystacks:
        from pydoc_data.topics import topics

        text = " ".join(topics.values())
        prose = str(out / "prose.txt")
        # the haystack lola writes there, and nothing else: an edited or foreign prose.txt would
        # be read as the prose haystack (and the points' digests would call it a new input)
        check_target(Path(prose), lambda p: p.read_bytes() == text.encode("utf-8"), "lola sweep")
        if not Path(prose).is_file():
            write_files(out, {"prose.txt": text}, writer="lola sweep")
    rows = []
    first_dir: dict[str, Path] = {}  # a point's run (as JSON) -> the folder of the first point that ran it
    for haystack in sweep.haystacks:
        for length in sweep.lengths:
            for budget in sweep.budgets:
                run = point_run(sweep, haystack, length, budget, prose)
                point_dir = out / f"{haystack}-{length}-{_label(budget)}"
                key = run.model_dump_json()
                if key in first_dir:  # 1/8 of 8K is the paper's footprint: the same run is not generated twice
                    _copy_samples(first_dir[key], point_dir)
                first_dir.setdefault(key, point_dir)
                records = run_niah(run, model, tokenizer, point_dir, progress=progress, batch_size=batch_size)
                exact = run.sinks + run.window + run.sparse_size
                for method, by in summarize(records).items():
                    cell = by[length]
                    if "refused" in cell:  # full attention past the model's context: no point to draw
                        continue
                    rows.append({"haystack": haystack, "length": length, "budget": budget, "exact_tokens": exact, "method": method, **cell})
                body = json.dumps({"format": SWEEP_FORMAT, "sweep": json.loads(sweep.model_dump_json()), "versions": versions(), "rows": rows}, indent=1)
                write_files(out, {SWEEP_FILE: body + "\n"}, ours=is_sweep_file, writer="lola sweep")
    plot_sweep(rows, out)
    return rows


def _check_same_sweep(path: Path, sweep: BudgetSweep) -> None:
    """Refuse a run into a folder whose ``sweep.json`` holds a sweep of other options: its rows
    would be replaced by this run's (naming each option that differs, saved and requested)."""
    from lola.io.outputs import read_json

    if not path.is_file():
        return
    saved = read_json(path, "a lola sweep file").get("sweep")
    now = json.loads(sweep.model_dump_json())
    if not isinstance(saved, dict):
        raise ValueError(f"{path} has no sweep options; move it away or choose another --out")
    # a sweep may grow (more lengths, budgets or haystacks: the saved points are resumed and
    # kept), not lose points or change how they were run
    grows = ("lengths", "budgets", "haystacks")
    differ = [
        k
        for k in sorted(set(saved) | set(now))
        if (not set(map(str, saved.get(k) or [])) <= set(map(str, now.get(k) or [])) if k in grows else saved.get(k) != now.get(k))
    ]
    if differ:
        shown = "; ".join(f"--{k.replace('_', '-')} {saved.get(k)} there, {now.get(k)} here" for k in differ)
        raise ValueError(
            f"lola sweep: {path} holds a sweep of other options ({shown}); its rows would be replaced: "
            "choose another --out, or run with its options (more lengths, budgets or haystacks may be added)"
        )


def _copy_samples(source: Path, target: Path) -> None:
    """Start ``target`` from ``source``'s saved samples (the same run), unless it holds results
    of its own; :func:`~lola.eval.niah_execution.run_niah` then resumes it with nothing left to
    generate, checking the copied run against its own as on any resume."""
    from lola.eval.niah_records import RESULTS_FILE, SAMPLES_FILE

    if (target / RESULTS_FILE).exists() or (target / SAMPLES_FILE).exists():
        return
    target.mkdir(parents=True, exist_ok=True)
    for name in (RESULTS_FILE, SAMPLES_FILE):
        if (source / name).is_file():
            shutil.copyfile(source / name, target / name)


def plot_sweep(rows: list[dict], out_dir: str | Path) -> list[Path]:
    """``sweep-<haystack>.png``: accuracy (95% Wilson intervals) against exact tokens per K/V
    head, a panel per length, a line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lola.io.figures import figure_is_ours, save_png
    from lola.io.outputs import write_files

    paths = []
    for haystack in sorted({r["haystack"] for r in rows}):
        mine = [r for r in rows if r["haystack"] == haystack]
        lengths = sorted({r["length"] for r in mine})
        fig, axes = plt.subplots(1, len(lengths), figsize=(4.2 * len(lengths), 3.6), squeeze=False)
        for ax, n in zip(axes[0], lengths):
            for method in sorted({r["method"] for r in mine}):
                pts = sorted((r for r in mine if r["length"] == n and r["method"] == method), key=lambda r: r["exact_tokens"])
                xs, ys = [r["exact_tokens"] for r in pts], [r["accuracy"] for r in pts]
                err = [[y - r["low"] for y, r in zip(ys, pts)], [r["high"] - y for y, r in zip(ys, pts)]]
                ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=method)
            ax.set_xscale("log", base=2)
            ax.set_ylim(-5, 105)  # the same scale in every panel, so lengths compare at a glance
            ax.set_title(f"{haystack}, {n} tokens", fontsize=9)
            ax.set_xlabel("exact tokens per K/V head")
            ax.set_ylabel("accuracy (%)")
            ax.grid(True, alpha=0.3)
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        (path,) = write_files(out_dir, {f"sweep-{haystack}.png": lambda p, fig=fig: save_png(fig, p, dpi=110)}, ours=figure_is_ours, writer="lola sweep")
        plt.close(fig)
        paths.append(path)
    return paths


def format_sweep(rows: list[dict]) -> str:
    """One table per haystack: a row per (length, budget), a column per method (accuracy % [95% interval])."""
    blocks = []
    for haystack in sorted({r["haystack"] for r in rows}):
        mine = [r for r in rows if r["haystack"] == haystack]
        methods = sorted({r["method"] for r in mine})
        head = f"{'length':>6} {'budget':>6} {'exact':>6} | " + " | ".join(f"{m:>16}" for m in methods)
        lines = [f"{haystack} haystack", head, "-" * len(head)]
        for n, budget, exact in sorted({(r["length"], r["budget"], r["exact_tokens"]) for r in mine}, key=lambda x: (x[0], x[2])):
            cells = {r["method"]: r for r in mine if (r["length"], r["budget"]) == (n, budget)}
            text = [f"{c['accuracy']:5.0f}% [{c['low']:3.0f}-{c['high']:3.0f}]" if (c := cells.get(m)) else "" for m in methods]
            lines.append(f"{n:>6} {budget:>6} {exact:>6} | " + " | ".join(f"{t:>16}" for t in text))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
