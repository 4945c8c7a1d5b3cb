"""How far could better scoring go? Force the needle's line into the sparse cache and see.

A diagnostic on *tuning* prompts (the seed-1 offsets of ``experiments/screen_budgets.py``, prose
haystack, not the reported ``lola niah`` samples). Variants are ``POLICY-BUDGETS[-HEAD]``:

- ``POLICY``: ``sre`` (self-recall error) or ``oracle`` (SRE plus a large constant on every
  token of the needle's line, so the line stays exact wherever a head has room for it);
- ``BUDGETS``: ``uniform`` (192 sparse slots per K/V head) or ``cal`` (the shipped calibrated
  budgets; same total);
- ``HEAD``: also force the first HEAD prompt tokens (system prompt and instruction).

Every variant keeps 4 sinks + 60 window + 192 sparse slots per K/V head on average.

With ``--feature-maps`` (the shipped linearized model, read as the default ``lola niah`` reads
it: the paper's rule, the learned scorer with four copies kept, calibrated budgets) the
variants are ``default`` and ``oracle`` (the default's policy plus the constant on the needle's
line): how much of a cell's miss is the scorer's.

``--surprisal`` instead prints, for each needle token, the fraction of prompt tokens the stock
model finds more surprising (is the needle where a language model is surprised?).

    python experiments/needle_oracle.py --samples 12 --variants oracle-cal sre-cal oracle-uniform
    python experiments/needle_oracle.py --samples 12 --surprisal
    python experiments/needle_oracle.py --feature-maps smollm2-135m-instruct --length 4096 --samples 8 --variants default oracle
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import ClassVar

import torch

import lola
from lola.eval.niah import make_sample, string_match_all
from lola.policies import build, register
from lola.policies.builtin import SelfRecallError


@dataclass
class NeedleOracle:
    """An inner policy (SRE by default), plus ``1e4`` for candidates whose position lies in
    ``forced`` (``[start, end)`` ranges). The inner policy's capabilities are its own (a policy
    that keeps scores keeps the inner scores, without the constant, which is added anew at
    every step).

    ``forced`` is set per prompt by the script, for every layer's instance at once.
    """

    forced: ClassVar[list[tuple[int, int]]] = []
    policy: str = "sre"
    policy_kwargs: dict | None = None

    def __post_init__(self) -> None:
        self.inner = SelfRecallError() if self.policy == "sre" else build(self.policy, **(self.policy_kwargs or {}))
        for capability in ("needs_attention", "needs_queries", "keeps_scores"):
            setattr(self, capability, bool(getattr(self.inner, capability, False)))

    def score(self, candidates, ctx):
        inside = torch.zeros_like(candidates.pos, dtype=torch.bool)
        for start, end in self.forced:
            inside |= (candidates.pos >= start) & (candidates.pos < end)
        return self.inner.score(candidates, ctx).float() + 1e4 * inside


register("needle_oracle", NeedleOracle, overwrite=True)


def needle_span(tok, sample) -> tuple[int, int]:
    """Token span ``[start, end)`` of the needle's line in ``sample`` (one token of margin each side)."""
    text, value = sample.text, sample.answers[0]
    at = text.index(value)
    line_start, line_end = text.rfind("\n", 0, at) + 1, text.find("\n", at)
    start = len(tok(text[:line_start], add_special_tokens=False).input_ids)
    end = len(tok(text[:line_end], add_special_tokens=False).input_ids)
    return start - 1, end + 1


def answer(model, tok, sample) -> str:
    with torch.no_grad():
        ids = model.generate(sample.input_ids, max_new_tokens=12, do_sample=False, pad_token_id=tok.eos_token_id)
    return tok.decode(ids[0, sample.length :], skip_special_tokens=True)


def run_variant(model, tok, prompts, name: str, budgets) -> None:
    policy, allocation, *head = name.split("-")
    if policy not in ("sre", "oracle") or allocation not in ("uniform", "cal"):
        raise SystemExit(f"variant {name!r}: expected sre|oracle-uniform|cal[-HEAD]")
    cfg = lola.LoLAConfig(window=60, sparse_size=192, sinks=4, chunk=64, mixing="softmax_only", policy="needle_oracle" if policy == "oracle" else "sre")
    if allocation == "cal":
        cfg = budgets.apply(cfg)
    with lola.patch(model, cfg):
        answer_all(model, tok, prompts, name, [(0, int(head[0]))] if head else [])


def answer_all(model, tok, prompts, name: str, also_forced: list[tuple[int, int]]) -> None:
    """Answer every prompt (the needle's line forced, and ``also_forced``, for the oracle) and
    print the misses and the count."""
    hits, t0, kept = 0.0, time.perf_counter(), []
    for sample in prompts:
        NeedleOracle.forced = [needle_span(tok, sample)] + also_forced
        prediction = answer(model, tok, sample)
        score = string_match_all(prediction, sample.answers)
        hits += score
        kept.append(int(score))
        if score < 1:
            print(f"   miss: {prediction!r} (answer {sample.answers[0]})", flush=True)
    print(f"{name}: {hits:.0f}/{len(prompts)} in {time.perf_counter() - t0:.0f}s; per sample {kept}", flush=True)


def run_linearized(model, tok, prompts, names: list[str], feature_maps: str, length: int) -> None:
    """The variants ``default`` and ``oracle`` on the linearized model, as ``lola niah`` runs it."""
    from lola.eval.niah_spec import NiahRun, method_configs
    from lola.integrations.transformers import apply_lola, remove_lola
    from lola.pretrained.folder import read_feature_maps

    run = NiahRun(model="smollm2-135m-instruct", feature_maps=feature_maps, methods=["lola"], policies=["learned"], lengths=[length], samples=1)
    ((_, default),) = method_configs(run).items()
    maps = read_feature_maps(feature_maps)
    for name in names:
        if name not in ("default", "oracle"):
            raise SystemExit(f"variant {name!r}: with --feature-maps, expected default or oracle")
        oracle = {"policy": "needle_oracle", "policy_kwargs": {"policy": default.policy, "policy_kwargs": default.policy_kwargs}}
        apply_lola(model, default.model_copy(update=oracle) if name == "oracle" else default, feature_maps=maps)
        try:
            answer_all(model, tok, prompts, name, [])
        finally:
            remove_lola(model)


def surprisal_ranks(model, tok, prompts) -> None:
    for i, sample in enumerate(prompts):
        start, end = needle_span(tok, sample)
        start, end = start + 1, end - 1  # the line itself
        with torch.no_grad():
            logits = model(sample.input_ids).logits[0].float()
        nll = -torch.log_softmax(logits[:-1], -1).gather(1, sample.input_ids[0, 1:, None])[:, 0]
        nll = torch.cat([torch.zeros(1), nll])
        above = (nll[None, :] > nll[start:end, None]).float().mean(1)
        tokens = tok.convert_ids_to_tokens(sample.input_ids[0, start:end])
        print(i, " ".join(f"{t}:{r:.2f}" for t, r in zip(tokens, above.tolist())), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="*", default=[])
    ap.add_argument("--samples", type=int, default=12)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--only", type=int, nargs="*", help="indices of the samples to run (default all)")
    ap.add_argument("--full", action="store_true", help="also print full attention's answers")
    ap.add_argument("--surprisal", action="store_true", help="print the needle tokens' surprisal ranks")
    ap.add_argument("--feature-maps", help="the linearized model (a shipped name): variants default and oracle")
    args = ap.parse_args()
    from pydoc_data.topics import topics

    haystack = " ".join(topics.values())
    model, tok = lola.models.load("smollm2-135m-instruct")
    prompts = [
        make_sample(tok, "niah_single_1", args.length, (i + 0.5) / args.samples, seed=100_003 + i, max_new_tokens=12, haystack=haystack)
        for i in range(args.samples)
    ]
    if args.only:
        prompts = [prompts[i] for i in args.only]
    if args.surprisal:
        surprisal_ranks(model, tok, prompts)
    if args.full:
        hits = sum(string_match_all(answer(model, tok, s), s.answers) for s in prompts)
        print(f"full: {hits:.0f}/{len(prompts)}", flush=True)
    if args.feature_maps:
        run_linearized(model, tok, prompts, args.variants, args.feature_maps, args.length)
        return
    budgets = lola.budgets.load("smollm2-135m-instruct")
    for name in args.variants:
        run_variant(model, tok, prompts, name, budgets)


if __name__ == "__main__":
    main()
