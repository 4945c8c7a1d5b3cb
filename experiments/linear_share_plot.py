"""Plot the linear state's share of each layer's output from ``lola perplexity --out`` files.

``lola perplexity`` measures, for every LoLA method, the share ``α`` of the layers' outputs that
comes from the linear state (:mod:`lola.eval.linear_share`). This draws one line per method and
length across the layers:

    lola perplexity --feature-maps smollm2-135m-instruct --sinks 4 --length 2048 --windows 4 \\
        --generate 0 --methods hybrid lola --out authors.json
    lola perplexity --feature-maps smollm2-135m-instruct --sinks 4 --length 2048 --windows 4 \\
        --generate 0 --methods lola --mixing lolcats --out trained.json
    python experiments/linear_share_plot.py authors.json trained.json --out linear-share.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="JSON files written by `lola perplexity --out`")
    parser.add_argument("--out", default="linear-share.png", help="the figure (default linear-share.png)")
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for path in args.results:
        data = json.loads(Path(path).read_text())
        if data.get("format") != "lola-perplexity-results":
            raise SystemExit(f"{path} was not written by lola perplexity --out")
        for method, per_length in data["results"].items():
            for length, cell in per_length.items():
                if "linear_share_per_layer" not in cell:
                    continue  # full attention
                layers = sorted(cell["linear_share_per_layer"], key=int)
                shares = [100 * cell["linear_share_per_layer"][i] for i in layers]
                label = f"{method} ({cell['mixing']}), {length} tokens: mean {100 * cell['linear_share']:.1f}%"
                ax.plot([int(i) for i in layers], shares, marker="o", markersize=3, label=label)
    ax.set_xlabel("layer")
    ax.set_ylabel("share of the output from the linear state (%)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
