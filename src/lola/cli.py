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

    from lola.eval.runner import NiahRun, format_depth_summary, format_intervals, format_summary, run_niah, summarize, summarize_by_depth

    fields = ("model", "task", "lengths", "samples", "methods", "policies", "window", "sparse_size", "sinks", "chunk", "mixing", "feature_maps", "max_new_tokens", "seed", "haystack_file", "needle", "question", "answer_prefix", "budgets")
    try:
        options = _read_config(args.config) if args.config else {}
        options.update({f: getattr(args, f) for f in fields if getattr(args, f) is not None})
        batch_size = int(options.pop("batch_size", 1) if args.batch_size is None else args.batch_size)
        if batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1, got {batch_size}")
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
        records = run_niah(run, model, tok, args.out or f"results/niah-{run.task}", batch_size=batch_size)
    except (ValueError, KeyError, FileNotFoundError, RuntimeError) as err:
        print(f"lola niah: {err}", file=sys.stderr)
        return 2
    out = args.out or f"results/niah-{run.task}"
    print(f"\n{run.task}, exact budget {run.budget} tokens (accuracy %, cache MiB)\n")
    print(format_summary(summarize(records)))
    print("\naccuracy with 95% Wilson intervals\n")
    print(format_intervals(summarize(records)))
    print("\nby needle depth (accuracy %)\n")
    print(format_depth_summary(summarize_by_depth(records)))
    speed = {}
    for r in records:
        speed.setdefault(r["method"], []).append(r["tokens_per_second"])
    print("\ntokens/s: " + ", ".join(f"{m} {sum(v) / len(v):.0f}" for m, v in speed.items()))
    print(f"\nresults: {out}/results.json, samples.jsonl, accuracy.png, cache_bytes.png")
    return 0


def _print_errors(command: str, err: Exception) -> None:
    import pydantic

    errors = err.errors() if isinstance(err, pydantic.ValidationError) else [{"loc": (), "msg": str(err)}]
    for e in errors:
        where = f"--{str(e['loc'][0]).replace('_', '-')}: " if e["loc"] else ""
        print(f"lola {command}: {where}{e['msg']}", file=sys.stderr)


def _linearize(args: argparse.Namespace) -> int:
    from lola.linearize import FinetuneConfig, LinearizeConfig, finetune, linearize

    stage1 = {"window": "window", "feature_map": "feature_map", "feature_dim": "feature_dim", "mixing": "mixing", "steps": "steps", "lr": "lr",
              "chunk_tokens": "chunk_tokens", "train_chunks": "train_chunks", "eval_chunks": "eval_chunks", "text": "text",
              "checkpoint_every": "checkpoint_every", "seed": "seed", "batch": "batch", "device": "device"}
    stage2 = {"stage2_steps": "steps", "batch": "batch", "chunk_tokens": "seq_len", "lora_lr": "lr", "maps_lr": "maps_lr", "lora_rank": "lora_rank",
              "lora_alpha": "lora_alpha", "ce_weight": "ce_weight", "kl_weight": "kl_weight", "eval_chunks": "eval_chunks", "text": "text",
              "checkpoint_every": "checkpoint_every", "seed": "seed", "device": "device"}
    opts1 = {f: getattr(args, a) for a, f in stage1.items() if getattr(args, a) is not None}
    opts2 = {f: getattr(args, a) for a, f in stage2.items() if getattr(args, a) is not None}
    model_name = args.model
    if args.quick:  # a smoke run: tiny random model, a few short steps
        model_name = model_name or "tiny-random-llama"
        quick = {"text": ["pydoc"], "eval_chunks": 1}  # no corpus download for a smoke run
        opts1 = {**quick, "steps": 6, "chunk_tokens": 128, "train_chunks": 3, "window": 16, "checkpoint_every": 3, **opts1}
        opts2 = {**quick, "steps": 4, "seq_len": 128, "warmup_steps": 1, "checkpoint_every": 2, **opts2}
    model_name = model_name or "smollm2-135m-instruct"
    try:
        cfg1 = LinearizeConfig(**opts1) if args.stage in ("1", "all") else None
        cfg2 = FinetuneConfig(**opts2) if args.stage in ("2", "all") else None
    except ValueError as err:
        _print_errors("linearize", err)
        return 2
    from lola import models

    try:
        model, tok = models.load(model_name)
        from pathlib import Path

        from lola.linearize.finetuning import FINETUNE_CHECKPOINT_FILE

        if cfg1 is not None and cfg2 is not None and (Path(args.out) / FINETUNE_CHECKPOINT_FILE).is_file():
            print(f"stage 1: done ({args.out} holds a stage-2 checkpoint)", file=sys.stderr)
        elif cfg1 is not None:
            linearize(model, tok, cfg1, args.out, model_name=model_name)
        if cfg2 is not None:
            finetune(model, tok, cfg2, args.out, maps=args.feature_maps, model_name=model_name)
    except (ValueError, FileNotFoundError, RuntimeError, KeyError) as err:
        print(f"lola linearize: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\nlola linearize: interrupted; run the same command again to resume from the last checkpoint in {args.out}", file=sys.stderr)
        return 130
    print(f"linearized: {args.out} (use with --feature-maps {args.out})")
    return 0


def _perplexity(args: argparse.Namespace) -> int:
    from lola.eval.perplexity import PerplexityRun, format_perplexity, run_perplexity

    fields = ("model", "lengths", "methods", "feature_maps", "window", "sparse_size", "sinks", "chunk", "policy", "windows", "text", "generate", "generate_windows")
    try:
        run = PerplexityRun(**{f: getattr(args, f) for f in fields if getattr(args, f) is not None})
        if run.feature_maps is not None:
            from lola.linearize import read_feature_maps

            read_feature_maps(run.feature_maps)
    except (ValueError, FileNotFoundError) as err:
        _print_errors("perplexity", err)
        return 2
    from lola import models

    try:
        model, tok = models.load(run.model)
        results = run_perplexity(run, model, tok)
    except (ValueError, KeyError, FileNotFoundError, RuntimeError) as err:
        print(f"lola perplexity: {err}", file=sys.stderr)
        return 2
    from lola.data import describe

    print(f"\nheld-out perplexity ({describe(run.text)}, held-out {run.heldout_fraction:.0%}; window {run.window}, sparse {run.sparse_size}, sinks {run.sinks}"
          f"{', feature maps ' + run.feature_maps if run.feature_maps else ', untrained feature maps'})\n")
    print(format_perplexity(results))
    if args.out:
        import json
        from pathlib import Path

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"run": run.model_dump(), "results": results}, indent=2) + "\n")
        print(f"\nresults: {args.out}")
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from lola.eval.calibrate import calibrate

    for name in ("length", "prompts"):
        if getattr(args, name) < 1:
            print(f"lola calibrate: --{name} must be >= 1, got {getattr(args, name)}", file=sys.stderr)
            return 2
    out = Path(args.out)
    if out.exists() and not out.is_file():
        print(f"lola calibrate: --out {args.out} is not a file", file=sys.stderr)
        return 2
    from lola import models

    try:
        model, tok = models.load(args.model)
        budgets = calibrate(model, tok, model_name=args.model, length=args.length, prompts=args.prompts, sparse_size=args.sparse_size, power=args.power, floor=args.floor, seed=args.seed)
        out.parent.mkdir(parents=True, exist_ok=True)
        budgets.save(out)
    except (ValueError, FileNotFoundError, RuntimeError, OSError) as err:
        print(f"lola calibrate: {err}", file=sys.stderr)
        return 2
    print(budgets.summary())
    print(f"\nbudgets: {out} (use with `lola niah --budgets {out}` or lola.budgets.load)")
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
    niah.add_argument("--sparse-size", dest="sparse_size", type=int, help="sparse cache of the lola method (default 192)")
    niah.add_argument("--sinks", type=int, help="pinned first tokens (default 4)")
    niah.add_argument("--chunk", type=int, help="tokens between select-and-evict steps (default 64)")
    niah.add_argument("--mixing", help="mixing rule of the lola method (default softmax_only; with --feature-maps, theirs)")
    niah.add_argument("--feature-maps", dest="feature_maps", help="a `lola linearize` folder: trained feature maps for every method but full")
    niah.add_argument("--max-new-tokens", dest="max_new_tokens", type=int, help="tokens generated per answer (default 12; 64 for niah_multikey_3 and vt)")
    niah.add_argument("--seed", type=int)
    niah.add_argument("--haystack-file", dest="haystack_file", help="a text whose sentences replace the noise haystack (niah_single_1)")
    niah.add_argument("--needle", help="needle template with {key} and {value} (with --question)")
    niah.add_argument("--question", help="question template with {key} (with --needle)")
    niah.add_argument("--answer-prefix", dest="answer_prefix", help="with --question: text that starts the answer, with {key}")
    niah.add_argument("--budgets", help="sparse budgets of the lola method: auto (default: the model's shipped calibrated budgets, else uniform), uniform, a shipped name (e.g. smollm2-135m-instruct) or a `lola calibrate` file")
    niah.add_argument("--batch-size", dest="batch_size", type=int, help="samples of one length generated as one left-padded batch (default 1)")
    niah.add_argument("--config", help="a JSON or YAML file of options (also `variants`: named LoLA configs to compare); command-line options override it")
    niah.add_argument("--out", help="results folder (default results/niah-TASK); re-running resumes")
    niah.set_defaults(func=_niah)

    lin = sub.add_parser("linearize", help="linearize a model: attention transfer (stage 1), then LoRA fine-tuning against it (stage 2)")
    lin.add_argument("--model", help="registered name, .gguf file or Hugging Face folder (default smollm2-135m-instruct)")
    lin.add_argument("--out", required=True, help="output folder (re-running resumes from its checkpoints)")
    lin.add_argument("--stage", choices=("1", "2", "all"), default="all", help="1: attention transfer; 2: LoRA fine-tuning from the stage-1 maps in --out (or --feature-maps); all (default): both")
    lin.add_argument("--feature-maps", dest="feature_maps", help="stage 2 only: the stage-1 folder to start from (default: --out)")
    lin.add_argument("--text", nargs="+", help="training text: files, folders (.txt/.md/.rst) or corpus names (default: the default corpus, see `lola.corpora`)")
    lin.add_argument("--chunk-tokens", dest="chunk_tokens", type=int, help="tokens per training sequence, both stages (default 2048)")
    lin.add_argument("--batch", type=int, help="sequences per optimizer step, over all processes under torchrun (default 1)")
    lin.add_argument("--eval-chunks", dest="eval_chunks", type=int, help="held-out sequences for the before/after report (default 2)")
    lin.add_argument("--checkpoint-every", dest="checkpoint_every", type=int, help="steps between checkpoints")
    lin.add_argument("--seed", type=int)
    lin.add_argument("--device", choices=("auto", "cpu", "cuda"), help="where both stages train (default auto: CUDA when available)")
    g1 = lin.add_argument_group("stage 1 (attention transfer)")
    g1.add_argument("--steps", type=int, help="optimizer steps (default 400)")
    g1.add_argument("--lr", type=float, help="AdamW learning rate (default 1e-2, cosine decay)")
    g1.add_argument("--window", type=int, help="exact keys per query of the hybrid (default 64)")
    g1.add_argument("--feature-map", dest="feature_map", help="hedgehog_identity (default) or hedgehog")
    g1.add_argument("--feature-dim", dest="feature_dim", type=int, help="f of a random-init hedgehog map (default 64)")
    g1.add_argument("--mixing", help="lolcats (default) or lola_authors")
    g1.add_argument("--train-chunks", dest="train_chunks", type=int, help="distinct training chunks (default 24)")
    g2 = lin.add_argument_group("stage 2 (LoRA fine-tuning, KL to the stock model)")
    g2.add_argument("--stage2-steps", dest="stage2_steps", type=int, help="optimizer steps (default 150)")
    g2.add_argument("--lora-lr", dest="lora_lr", type=float, help="learning rate of the LoRA weights (default 1e-3)")
    g2.add_argument("--maps-lr", dest="maps_lr", type=float, help="learning rate of the feature maps and window factors (default 1e-3; 0 freezes them)")
    g2.add_argument("--lora-rank", dest="lora_rank", type=int, help="LoRA rank (default 8)")
    g2.add_argument("--lora-alpha", dest="lora_alpha", type=float, help="LoRA alpha (default 16)")
    g2.add_argument("--kl-weight", dest="kl_weight", type=float, help="weight of KL(teacher || student) (default 1)")
    g2.add_argument("--ce-weight", dest="ce_weight", type=float, help="weight of the next-token cross-entropy (default 0)")
    lin.add_argument("--quick", action="store_true", help="a few short steps of both stages on a tiny random model (smoke test)")
    lin.set_defaults(func=_linearize)

    cal = sub.add_parser("calibrate", help="find the retrieval heads of a model and write per-head sparse budgets")
    cal.add_argument("--model", default="smollm2-135m-instruct", help="registered name, .gguf file or Hugging Face folder (default smollm2-135m-instruct)")
    cal.add_argument("--out", required=True, help="budgets JSON file to write (use with `lola niah --budgets FILE`)")
    cal.add_argument("--length", type=int, default=2048, help="tokens per calibration prompt (default 2048)")
    cal.add_argument("--prompts", type=int, default=16, help="calibration prompts (default 16)")
    cal.add_argument("--sparse-size", dest="sparse_size", type=int, default=192, help="the uniform sparse size to redistribute (default 192)")
    cal.add_argument("--power", type=float, default=0.5, help="budget ∝ score ** power (default 0.5)")
    cal.add_argument("--floor", type=int, default=0, help="sparse slots every head keeps (default 0)")
    cal.add_argument("--seed", type=int, default=0)
    cal.set_defaults(func=_calibrate)

    ppl = sub.add_parser("perplexity", help="held-out perplexity of full attention, the hybrid (lolcats) and LoLA")
    ppl.add_argument("--model", help="registered name, .gguf file or Hugging Face folder (default smollm2-135m-instruct)")
    ppl.add_argument("--feature-maps", dest="feature_maps", help="a `lola linearize` folder (default: untrained maps)")
    ppl.add_argument("--length", "--lengths", dest="lengths", type=int, nargs="+", help="context lengths (default 1024 2048)")
    ppl.add_argument("--methods", nargs="+", help="any of full lolcats lola (default all)")
    ppl.add_argument("--window", type=int, help="sliding window (default 64)")
    ppl.add_argument("--sparse-size", dest="sparse_size", type=int, help="sparse cache of the lola method (default 64)")
    ppl.add_argument("--sinks", type=int, help="pinned first tokens (default 0)")
    ppl.add_argument("--chunk", type=int, help="tokens between select-and-evict steps (default 64)")
    ppl.add_argument("--policy", help="scoring policy of the lola method (default sre)")
    ppl.add_argument("--windows", type=int, help="held-out windows per length (default 4)")
    ppl.add_argument("--text", nargs="+", help="files, folders or corpus names whose last 10%% is held out (default: the default corpus)")
    ppl.add_argument("--generate", type=int, help="greedy tokens generated per window for the repetition check (default 64; 0: off)")
    ppl.add_argument("--generate-windows", dest="generate_windows", type=int, help="windows per length continued for the repetition check (default 2)")
    ppl.add_argument("--out", help="also write the results to this JSON file")
    ppl.set_defaults(func=_perplexity)
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
