"""How far could better scoring go? Force the needle's line into the sparse cache and see.

A diagnostic on *tuning* prompts (the seed-1 offsets of ``examples/screen_budgets.py``, prose
haystack, not the reported ``lola niah`` samples). Variants are ``POLICY-BUDGETS[-HEAD]``:

- ``POLICY``: ``sre`` (self-recall error) or ``oracle`` (SRE plus a large constant on every
  token of the needle's line, so the line stays exact wherever a head has room for it);
- ``BUDGETS``: ``uniform`` (192 sparse slots per K/V head) or ``cal`` (the shipped calibrated
  budgets; same total);
- ``HEAD``: also force the first HEAD prompt tokens (system prompt and instruction).

Every variant keeps 4 sinks + 60 window + 192 sparse slots per K/V head on average.
``--surprisal`` instead prints, for each needle token, the fraction of prompt tokens the stock
model finds more surprising (is the needle where a language model is surprised?).

    python examples/needle_oracle.py --samples 12 --variants oracle-cal sre-cal oracle-uniform
    python examples/needle_oracle.py --samples 12 --surprisal
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import ClassVar

import torch

import lola
from lola.eval.niah import make_sample, string_match_all
from lola.policies import register
from lola.policies.builtin import SelfRecallError


@dataclass
class NeedleOracle:
    """SRE, plus ``1e4`` for candidates whose position lies in ``forced`` (``[start, end)`` ranges).

    ``forced`` is set per prompt by the script, for every layer's instance at once.
    """

    forced: ClassVar[list[tuple[int, int]]] = []
    needs_attention: bool = False

    def __post_init__(self) -> None:
        self.sre = SelfRecallError()

    def score(self, candidates, ctx):
        inside = torch.zeros_like(candidates.pos, dtype=torch.bool)
        for start, end in self.forced:
            inside |= (candidates.pos >= start) & (candidates.pos < end)
        return self.sre.score(candidates, ctx) + 1e4 * inside


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
    hits, t0, kept = 0.0, time.perf_counter(), []
    with lola.patch(model, cfg):
        for sample in prompts:
            NeedleOracle.forced = [needle_span(tok, sample)] + ([(0, int(head[0]))] if head else [])
            prediction = answer(model, tok, sample)
            score = string_match_all(prediction, sample.answers)
            hits += score
            kept.append(int(score))
            if score < 1:
                print(f"   miss: {prediction!r} (answer {sample.answers[0]})", flush=True)
    print(f"{name}: {hits:.0f}/{len(prompts)} in {time.perf_counter() - t0:.0f}s; per sample {kept}", flush=True)


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
    budgets = lola.budgets.load("smollm2-135m-instruct")
    for name in args.variants:
        run_variant(model, tok, prompts, name, budgets)


if __name__ == "__main__":
    main()
