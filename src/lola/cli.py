"""The ``lola`` command."""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def _demo(args: argparse.Namespace) -> int:
    from lola.demo import format_table, run_demo

    print(f"Needle recall, one attention head, {args.length} tokens, {args.trials} needle depths, exact budget {args.budget} tokens\n")
    print(format_table(run_demo(length=args.length, trials=args.trials, budget=args.budget, seed=args.seed)))
    return 0


def _niah(args: argparse.Namespace) -> int:
    import pydantic

    from lola.eval.runner import NiahRun, format_depth_summary, format_summary, run_niah, summarize, summarize_by_depth

    fields = ("model", "task", "lengths", "samples", "methods", "policies", "window", "sparse_size", "sinks", "chunk", "mixing", "max_new_tokens", "seed", "haystack_file", "needle", "question")
    try:
        options = _read_config(args.config) if args.config else {}
        options.update({f: getattr(args, f) for f in fields if getattr(args, f) is not None})
        run = NiahRun(**options)
    except (OSError, ValueError) as err:
        errors = err.errors() if isinstance(err, pydantic.ValidationError) else [{"loc": ("config",), "msg": str(err)}]
        for e in errors:
            where = f"--{str(e['loc'][0]).replace('_', '-')}: " if e["loc"] else ""
            print(f"lola niah: {where}{e['msg']}", file=sys.stderr)
        return 2
    from lola import models

    try:
        model, tok = models.load(run.model)
        records = run_niah(run, model, tok, args.out or f"results/niah-{run.task}")
    except (ValueError, KeyError, FileNotFoundError, RuntimeError) as err:
        print(f"lola niah: {err}", file=sys.stderr)
        return 2
    out = args.out or f"results/niah-{run.task}"
    print(f"\n{run.task}, exact budget {run.budget} tokens (accuracy %, cache MiB)\n")
    print(format_summary(summarize(records)))
    print("\nby needle depth (accuracy %)\n")
    print(format_depth_summary(summarize_by_depth(records)))
    speed = {}
    for r in records:
        speed.setdefault(r["method"], []).append(r["tokens_per_second"])
    print("\ntokens/s: " + ", ".join(f"{m} {sum(v) / len(v):.0f}" for m, v in speed.items()))
    print(f"\nresults: {out}/results.json, samples.jsonl, accuracy.png, cache_bytes.png")
    return 0


def _read_config(path: str) -> dict:
    """Options from a JSON or YAML file (keys are NiahRun fields)."""
    import json

    with open(path) as f:
        text = f.read()
    if path.endswith((".yaml", ".yml")):
        import yaml

        data = yaml.safe_load(text)
    else:
        data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a mapping of options")
    return data


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``lola`` command."""
    parser = argparse.ArgumentParser(prog="lola", description="LoLA: linear attention that remembers.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="model-free needle-recall demo of every method")
    demo.add_argument("--length", type=int, default=2048, help="tokens per trial (default 2048)")
    demo.add_argument("--trials", type=int, default=8, help="needle depths (default 8)")
    demo.add_argument("--budget", type=int, default=128, help="exact tokens for the compressed methods (default 128)")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_demo)

    niah = sub.add_parser("niah", help="needle-in-a-haystack recall of full attention, window, lolcats and LoLA on a real model")
    niah.add_argument("--model", help="registered name, .gguf file or Hugging Face folder (default smollm2-135m-instruct)")
    niah.add_argument("--task", help="niah_single_1 (default), niah_multikey_2, niah_multikey_3 or vt")
    niah.add_argument("--lengths", type=int, nargs="+", help="context lengths in tokens (default 1024 2048)")
    niah.add_argument("--samples", type=int, help="samples per length, at evenly spread depths (default 5)")
    niah.add_argument("--methods", nargs="+", help="any of full window lolcats lola (default all)")
    niah.add_argument("--policies", nargs="+", help="scoring policies for the lola method (default sre)")
    niah.add_argument("--window", type=int, help="window of the lola method (default 60)")
    niah.add_argument("--sparse-size", dest="sparse_size", type=int, help="sparse cache of the lola method (default 64)")
    niah.add_argument("--sinks", type=int, help="pinned first tokens (default 4)")
    niah.add_argument("--chunk", type=int, help="tokens between select-and-evict steps (default 64)")
    niah.add_argument("--mixing", help="mixing rule of the lola method (default softmax_only)")
    niah.add_argument("--max-new-tokens", dest="max_new_tokens", type=int, help="tokens generated per answer (default 12; 64 for niah_multikey_3 and vt)")
    niah.add_argument("--seed", type=int)
    niah.add_argument("--haystack-file", dest="haystack_file", help="a text whose sentences replace the noise haystack (niah_single_1)")
    niah.add_argument("--needle", help="needle template with {key} and {value} (with --question)")
    niah.add_argument("--question", help="question template with {key} (with --needle)")
    niah.add_argument("--config", help="a JSON or YAML file of options; command-line options override it")
    niah.add_argument("--out", help="results folder (default results/niah-TASK); re-running resumes")
    niah.set_defaults(func=_niah)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``lola`` command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("length", "trials", "budget"):
        if getattr(args, name, 1) < 1:
            parser.error(f"--{name} must be >= 1")
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
