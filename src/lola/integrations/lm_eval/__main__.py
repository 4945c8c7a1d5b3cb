"""``python -m lola.integrations.lm_eval``: lm-evaluation-harness with the ``lola`` model, offline.

::

    python -m lola.integrations.lm_eval export-niah --out tasks/niah --model tiny-random-llama --lengths 512 --samples 5
    python -m lola.integrations.lm_eval run --model_args pretrained=tiny-random-llama,window=64,sparse_size=64 \\
        --tasks lola_niah_single_1 --include_path tasks/niah --device cpu
    python -m lola.integrations.lm_eval ls tasks --include_path tasks/niah

``run`` (and ``ls``, ``validate``) is lm-eval's own command (``lm-eval run --help``) with the
``lola`` model registered and ``--model lola`` unless another ``--model`` is given. Hugging
Face Hub and datasets access is switched off (``HF_HUB_OFFLINE``, ``HF_DATASETS_OFFLINE``,
``TRANSFORMERS_OFFLINE`` default to 1) unless ``--online`` is given: tasks whose datasets
are not local (or already in the datasets cache) then fail to load.
"""

from __future__ import annotations

import argparse
import os
import sys

OFFLINE_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
LM_EVAL_COMMANDS = ("run", "ls", "validate")


def export_parser() -> argparse.ArgumentParser:
    """The options of ``export-niah`` (those of ``lola niah`` that define the prompts)."""
    from lola.cli import OneLineParser

    p = OneLineParser(
        prog="python -m lola.integrations.lm_eval export-niah",
        description="Write the prompts of `lola niah` (same options, same samples) as a local lm-eval task.",
    )
    p.add_argument("--out", required=True, help="folder to write (pass it to lm-eval as --include_path)")
    p.add_argument(
        "--model",
        default="smollm2-135m-instruct",
        help="whose tokenizer sizes and wraps the prompts: a registered name, a .gguf file or a HF folder (default smollm2-135m-instruct)",
    )
    p.add_argument("--task", default="niah_single_1", help="niah_single_1 (default), niah_multikey_2, niah_multikey_3 or vt")
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048], help="context lengths in tokens (default 1024 2048)")
    p.add_argument("--samples", type=int, default=5, help="samples per length (default 5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=None, help="tokens to generate (default: 12 for numbers, 64 for uuids and vt)")
    p.add_argument("--haystack-file", default=None, help="a text whose sentences replace the noise haystack")
    p.add_argument("--needle", default=None, help="needle template with {key} and {value}")
    p.add_argument("--question", default=None, help="question template with {key}")
    p.add_argument("--answer-prefix", default=None, help="with --question: text with {key} that starts the answer")
    p.add_argument("--name", default=None, help="lm-eval task name (default lola_<task>)")
    return p


def export_main(argv: list[str]) -> int:
    """``export-niah``: exit status 0, or 2 with one line naming the bad option."""
    args = export_parser().parse_args(argv)
    from lola.errors import about, report
    from lola.integrations.lm_eval.niah import export_niah, load_tokenizer
    from lola.io.outputs import check_output_folder
    from lola.models import max_positions

    try:
        check_output_folder(args.out, "--out")  # a file or an unwritable place, before the tokenizer loads
        with about("--model"):
            tokenizer = load_tokenizer(args.model)
        path = export_niah(
            args.out,
            tokenizer,
            task=args.task,
            lengths=args.lengths,
            samples=args.samples,
            seed=args.seed,
            max_new_tokens=args.max_new_tokens,
            haystack_file=args.haystack_file,
            needle=args.needle,
            question=args.question,
            answer_prefix=args.answer_prefix,
            name=args.name,
            max_positions=max_positions(args.model),
        )
    except Exception as err:  # a user error: one line naming the option; anything else: a bug
        return report("export-niah", err, debug=os.environ.get("LOLA_DEBUG", "") not in ("", "0"))
    name = path.stem
    print(f"wrote {path} ({len(args.lengths) * args.samples} prompts)")
    print(f"run: python -m lola.integrations.lm_eval run --model_args pretrained={args.model} --tasks {name} --include_path {path.parent}")
    return 0


def lm_eval_main(argv: list[str]) -> int:
    """lm-eval's command line with the ``lola`` model registered (``--model lola`` by default)."""
    if "--online" in argv:
        argv = [a for a in argv if a != "--online"]
    else:
        for var in OFFLINE_ENV:
            os.environ.setdefault(var, "1")
    if argv[0] == "run" and not any(a in ("--model", "-M") or a.startswith("--model=") for a in argv):
        argv = [argv[0], "--model", "lola", *argv[1:]]
    from lm_eval._cli import HarnessCLI
    from lm_eval.utils import setup_logging

    import lola.integrations.lm_eval.model  # noqa: F401  (registers "lola")

    setup_logging()
    cli = HarnessCLI()
    saved = sys.argv
    sys.argv = ["lm-eval", *argv]
    try:
        cli.execute(cli.parse_args())
    except Exception as err:  # a bad model_arg: one line naming it; anything else: a bug
        from lola.errors import report

        return report("lm-eval", err, debug=os.environ.get("LOLA_DEBUG", "") not in ("", "0"), name=lambda field: f"model_args {field}")
    finally:
        sys.argv = saved
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if argv[0] == "export-niah":
        return export_main(argv[1:])
    if argv[0] not in LM_EVAL_COMMANDS:
        argv = ["run", *argv]  # as lm-eval: options without a command mean `run`
    return lm_eval_main(argv)


if __name__ == "__main__":
    sys.exit(main())
