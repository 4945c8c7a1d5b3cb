"""Reporting a needle-in-a-haystack run: accuracy per method and length with Wilson intervals, by depth, tables and plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable


def wilson_interval(hits: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of an accuracy of ``hits`` out of ``n``, in percent."""
    if n <= 0:
        raise ValueError(f"n must be > 0, got {n}")
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / (1 + z * z / n)
    return 100.0 * max(0.0, centre - half), 100.0 * min(1.0, centre + half)


def summarize(records: Iterable[dict]) -> dict[str, dict[int, dict[str, float]]]:
    """``{method: {length: {"accuracy": %, "low": %, "high": %, "cache_bytes": mean, "samples": n}}}``
    (``low``–``high``: the 95% Wilson interval of the accuracy); a cell the method cannot read
    (a :func:`refused_record`) is ``{"refused": reason}``."""
    table: dict[str, dict[int, list[dict]]] = {}
    for r in records:
        table.setdefault(r["method"], {}).setdefault(r["length"], []).append(r)
    out: dict[str, dict[int, dict[str, float]]] = {}
    for m, by in table.items():
        out[m] = {}
        for n, rs in sorted(by.items()):
            if any("refused" in r for r in rs):
                out[m][n] = {"refused": next(r["refused"] for r in rs if "refused" in r)}
                continue
            hits = sum(r["score"] for r in rs)
            low, high = wilson_interval(hits, len(rs))
            out[m][n] = {
                "accuracy": 100.0 * hits / len(rs),
                "low": low,
                "high": high,
                "cache_bytes": sum(r["cache_bytes"] for r in rs) / len(rs),
                "samples": len(rs),
            }
    return out


def refused_record(method: str, length: int, reason: str) -> dict:
    """The record of a cell a method cannot read (full attention past the model's context): it is
    shown as refused in the tables, never scored, and not saved with the samples."""
    return {"method": method, "length": length, "refused": reason}


def scored(records: Iterable[dict]) -> list[dict]:
    """The records of generated samples (not :func:`refused_record`)."""
    return [r for r in records if "refused" not in r]


def summarize_by_depth(records: Iterable[dict], buckets: int = 5) -> dict[str, dict[str, float]]:
    """``{method: {"0.0-0.2": accuracy %, …}}`` over all lengths, by needle depth."""
    table: dict[str, dict[int, list[float]]] = {}
    for r in scored(records):
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

    from lola.io.figures import figure_is_ours, save_png
    from lola.io.outputs import write_files

    summary = summarize(scored(records))
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
        (path,) = write_files(out_dir, {name: lambda p, fig=fig: save_png(fig, p, dpi=120)}, ours=figure_is_ours, writer="lola niah")
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
    return _table(summary, _or_refused(lambda c: f"{c['accuracy']:>7.1f}% {c['cache_bytes'] / 2**20:>6.1f}MiB", 16), 16)


def format_intervals(summary: dict[str, dict[int, dict[str, float]]]) -> str:
    """Accuracy with its 95% Wilson interval and the sample count, per method × length."""
    return _table(summary, _or_refused(lambda c: f"{c['accuracy']:>6.1f}% [{c['low']:>3.0f}-{c['high']:>3.0f}] n={c['samples']:<3}", 22), 22)


def _or_refused(cell: Any, width: int) -> Any:
    return lambda c: f"{'refused':>{width}}" if "refused" in c else cell(c)
