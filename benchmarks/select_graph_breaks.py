#!/usr/bin/env python
"""Where ``torch.compile`` would cut the select-and-evict step into pieces: a census of its graph breaks.

    python benchmarks/select_graph_breaks.py [--policy learned|sre] [--tokens 512]

The linearized SmolLM2 with ``lola niah``'s LoLA method for ``--policy`` (the shipped maps,
calibrated budgets, bounded positions; ``learned`` is the default run's ``distinct`` over the
learned scorer) prefills ``--tokens`` tokens of the noise haystack; at the first select step
(:func:`lola.engine.select_step.select`) ``torch._dynamo.explain`` traces the step on that
layer's real state and prints how many graphs it falls into, and each break's reason with the
line of lola that causes it. A step that compiles as one unit has one graph and no break. The
count does not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import niah_lola_config, noise_ids  # noqa: E402

import lola  # noqa: E402
from lola.engine import select_step  # noqa: E402
from lola.integrations.transformers import LoLACache, apply_lola  # noqa: E402


class _Traced(Exception):
    """Raised once the first step is traced: the prefill has nothing more to say."""


def census(step, state, rows, feature_map_k, scale) -> None:
    """Print ``torch._dynamo.explain``'s graphs and breaks of ``step`` (the select step) on this state."""
    import torch._dynamo as dynamo

    report = dynamo.explain(step)(state, rows, feature_map_k, scale)
    print(f"graphs {report.graph_count}, breaks {report.graph_break_count}, operators in graphs {report.op_count}")
    where: collections.Counter = collections.Counter()
    for brk in report.break_reasons:
        ours = [f for f in brk.user_stack or () if "/lola/" in f.filename]  # the deepest line of lola
        line = f"{ours[-1].filename.split('src/')[-1]}:{ours[-1].lineno}" if ours else "?"
        where[(brk.reason.splitlines()[0][:100], line)] += 1
    for (reason, line), n in where.most_common():
        print(f"  {n} x {reason}  ({line})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default="learned", choices=("learned", "sre"))
    parser.add_argument("--tokens", type=int, default=512, help="prefill tokens (the first step falls within them)")
    args = parser.parse_args()
    from lola.pretrained.folder import read_feature_maps

    model, tok = lola.models.load("smollm2-135m-instruct")
    method, cfg = niah_lola_config("smollm2-135m-instruct", "smollm2-135m-instruct", args.policy, args.tokens)
    apply_lola(model, cfg, feature_maps=read_feature_maps("smollm2-135m-instruct"))
    print(f"{method}: the first select step of a {args.tokens}-token prefill")
    original = select_step.select

    def first_step(*step_args):
        census(original, *step_args)
        raise _Traced

    select_step.select = first_step
    try:
        with torch.inference_mode():
            model(noise_ids(tok, args.tokens), cache=LoLACache(model))
    except _Traced:
        pass
    finally:
        select_step.select = original


if __name__ == "__main__":
    main()
