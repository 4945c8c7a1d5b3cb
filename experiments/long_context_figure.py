"""The long-context figure: pass-key accuracy and cache bytes against length, past the model's context.

    python experiments/long_context_figure.py RESULTS.json [RESULTS.json ...] --context 8192 --out docs/figures/long-context.png

Reads the summaries of ``lola niah`` runs (``results.json``; cells of one method at one length
taken from the first file that has them) and draws two panels on one length axis: accuracy
with its 95% Wilson interval (the methods drawn side by side around each length), and cache MiB. A refused cell (full attention past the model's
context) is drawn as an ``x`` on the context line of the cache panel, and the context as a
dashed line in both.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def read_cells(paths: list[str]) -> dict[str, dict[int, dict]]:
    """``{method: {length: cell}}`` over ``paths``, the first file's cell kept. A cell is
    summarised from the ``samples.jsonl`` beside the ``results.json`` when it has one (a run
    stopped mid-way summarises its samples only when resumed), else taken from the summary
    (refused cells are only there)."""
    from lola.eval.niah_report import summarize

    cells: dict[str, dict[int, dict]] = {}
    for path in paths:
        summary = json.loads(Path(path).read_text(encoding="utf-8"))["summary"]
        samples = Path(path).with_name("samples.jsonl")
        if samples.is_file():
            records = [json.loads(line) for line in samples.read_text(encoding="utf-8").splitlines() if line.strip()]
            for method, by in summarize(records).items():
                for length, cell in by.items():
                    summary.setdefault(method, {})[str(length)] = cell
        for method, by in summary.items():
            for length, cell in by.items():
                cells.setdefault(method, {}).setdefault(int(length), cell)
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", help="results.json files of lola niah runs")
    parser.add_argument("--context", type=int, required=True, help="the model's max_position_embeddings")
    parser.add_argument("--out", required=True)
    parser.add_argument("--methods", nargs="*", help="methods to draw, in this order (default: all)")
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = read_cells(args.results)
    methods = args.methods or list(cells)
    fig, (acc, mib) = plt.subplots(1, 2, figsize=(10, 4))
    for i, method in enumerate(methods):
        by = cells.get(method, {})
        ran = sorted(n for n, c in by.items() if "refused" not in c)
        if ran:
            ys = [by[n]["accuracy"] for n in ran]
            err = [[y - by[n]["low"] for y, n in zip(ys, ran)], [by[n]["high"] - y for y, n in zip(ys, ran)]]
            # methods side by side around each length (a log axis: a factor), so equal cells stay visible
            shift = 2 ** (0.04 * (i - (len(methods) - 1) / 2))
            line = acc.errorbar([n * shift for n in ran], ys, yerr=err, marker="o", capsize=3, label=method)
            color = line[0].get_color()
            mib.plot(ran, [by[n]["cache_bytes"] / 2**20 for n in ran], marker="o", color=color, label=method)
            refused = sorted(n for n, c in by.items() if "refused" in c)
            if refused:
                mib.scatter(refused, [by[ran[-1]]["cache_bytes"] / 2**20] * len(refused), marker="x", s=60, color=color, label=f"{method}: refused")
    for ax in (acc, mib):
        ax.axvline(args.context, linestyle="--", color="grey", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length (tokens)")
        ax.grid(True, alpha=0.3)
    acc.text(args.context, 102, " model's context", color="grey", fontsize=8)
    acc.set_ylim(-5, 110)
    acc.set_ylabel("pass-key accuracy (%)")
    mib.set_yscale("log")
    mib.set_ylabel("cache (MiB)")
    acc.legend(fontsize=8, loc="lower left")
    mib.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    from lola.io.figures import is_lola_png, save_png
    from lola.io.outputs import write_files

    out = Path(args.out)
    write_files(
        out.parent, {out.name: lambda p: save_png(fig, p, dpi=120)}, ours=lambda p: is_lola_png(p, folder_is_lola_s=True), writer="long_context_figure.py"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
