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
