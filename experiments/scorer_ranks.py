"""Where a learned scorer ranks the needle's digits in the heads that retrieve.

For tuning prompts (prose haystack, 2K; the seeds of ``experiments/needle_oracle.py``) and the 12
K/V heads with the largest shipped calibrated budgets, prints the fraction of the prompt's
tokens (outside sinks and window) that the scorer ranks above the needle's digit tokens,
averaged over the digits and the prompts: 0 = the digits are the scorer's top choice, 0.5 =
an ordinary token. A head whose budget holds ``λ`` of ``T`` tokens keeps the digits (if scores
were fixed over the prompt) when this fraction is below about ``λ / T``.

    python experiments/scorer_ranks.py SCORER [--samples 6]
"""

from __future__ import annotations

import argparse

import torch
from needle_oracle import needle_span

import lola
from lola.eval.niah import make_sample


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scorer", help="a shipped scorer name or a `lola fit-scorer` file")
    ap.add_argument("--samples", type=int, default=6)
    args = ap.parse_args()
    from pydoc_data.topics import topics

    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    scorer = lola.scorers.load(args.scorer)
    model, tok = lola.models.load("smollm2-135m-instruct")
    budgets = torch.tensor(lola.budgets.load("smollm2-135m-instruct").sparse_size_per_head)
    hkv = budgets.shape[1]
    heads = [(int(i) // hkv, int(i) % hkv) for i in budgets.flatten().topk(12).indices]
    keys: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def record(module, q, k, v, mask, **kw):
        keys[module.layer_idx] = (k[0].float(), v[0].float())
        return sdpa_attention_forward(module, q, k, v, mask, **kw)

    AttentionInterface.register("record_kv", record)
    AttentionMaskInterface.register("record_kv", sdpa_mask)
    model.set_attn_implementation("record_kv")
    haystack = " ".join(topics.values())
    above = {h: [] for h in heads}
    for i in range(args.samples):
        s = make_sample(tok, "niah_single_1", 2048, (i + 0.5) / 12, seed=100_003 + i, max_new_tokens=12, haystack=haystack)
        start, end = needle_span(tok, s)
        ids = s.input_ids[0]
        digits = [j for j in range(start, end) if any(c.isdigit() for c in tok.decode(ids[j]))]
        with torch.no_grad():
            model(s.input_ids, use_cache=False, logits_to_keep=1)
        t = ids.numel()
        pos = torch.arange(t).expand(1, hkv, t)
        for layer, head in heads:
            k, v = keys[layer]
            score = scorer.score(layer, k[None], v[None], pos)[0, head][4 : t - 64]  # outside sinks and window
            above[(layer, head)].append(sum(float((score > score[j - 4]).float().mean()) for j in digits) / len(digits))
    print(f"{'head':>7} {'budget':>6}  fraction of tokens ranked above the needle's digits")
    for layer, head in heads:
        print(f"L{layer:>2} h{head} {int(budgets[layer, head]):>6}  {sum(above[(layer, head)]) / len(above[(layer, head)]):.3f}")


if __name__ == "__main__":
    main()
