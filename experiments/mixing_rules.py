"""Training-free LoLA on SmolLM2-135M-Instruct under each mixing rule.

    python experiments/mixing_rules.py

Asks one question about an ~880-token story (greedy, 20 new tokens) with full attention and
with LoLA (window 64, sparse 64, sinks 4, SRE, untrained identity Hedgehog map) under the
``lolcats``, ``lola_authors`` and ``softmax_only`` rules, and prints each answer.
"""

import torch

import lola
from lola.integrations.transformers import LoLACache, apply_lola, remove_lola


def main() -> None:
    model, tok = lola.models.load("smollm2-135m-instruct")
    story = "Here is a story. " + "Once upon a time a fox lived in a forest near a river. " * 60
    messages = [{"role": "user", "content": story + "\nWhat animal lived in the forest?"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok(text, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=20, do_sample=False)
    print(f"prompt: {ids.shape[1]} tokens")
    print(f"{'full':<14}{tok.decode(out[0, ids.shape[1] :])!r}")
    for mixing in ("lolcats", "lola_authors", "softmax_only"):
        apply_lola(model, lola.LoLAConfig(window=64, sparse_size=64, sinks=4, mixing=mixing))
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=20, do_sample=False, cache=LoLACache(model))
        print(f"{mixing:<14}{tok.decode(out[0, ids.shape[1] :])!r}")
        remove_lola(model)


if __name__ == "__main__":
    main()
