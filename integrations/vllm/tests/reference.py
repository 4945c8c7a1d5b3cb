"""Greedy tokens of lola's own transformers path (apply_lola + LoLACache) for every case; the
``saved`` case loads the folder as it was exported (``lola.from_pretrained``: its own LoLA
config, trained feature maps and merged LoRA).

python reference.py MODEL_FOLDER OUT.json     # in lola's environment (transformers >= 5.24)
"""

import json
import sys

import torch
from cases import CONFIGS, LOGPROBS, MAX_TOKENS, prompts
from transformers import AutoModelForCausalLM, AutoTokenizer

from lola import LoLAConfig
from lola.integrations.transformers import LoLACache, apply_lola, from_pretrained, remove_lola


def main(folder: str, out: str, *cases: str) -> None:
    tok = AutoTokenizer.from_pretrained(folder)
    tokens = {}
    for name in cases or [c for c in CONFIGS if CONFIGS[c] is not None]:
        if CONFIGS[name] is None:
            model = from_pretrained(folder, dtype=torch.float32).eval()
        else:
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
            apply_lola(model, LoLAConfig(**CONFIGS[name]))
        tokens[name], tokens[f"{name}.logprobs"] = [], []
        for prompt in prompts(name):
            ids = tok(prompt, return_tensors="pt").input_ids
            with torch.no_grad():
                o = model.generate(
                    ids,
                    max_new_tokens=MAX_TOKENS,
                    do_sample=False,
                    cache=LoLACache(model),
                    eos_token_id=None,
                    pad_token_id=0,
                    output_logits=True,
                    return_dict_in_generate=True,
                )
            tokens[name].append(o.sequences[0, ids.shape[1] :].tolist())
            # the top LOGPROBS log-probabilities of every step: what vLLM's logprobs report
            tokens[f"{name}.logprobs"].append([torch.log_softmax(x[0].float(), -1).topk(LOGPROBS).values.tolist() for x in o.logits])
        remove_lola(model)
    json.dump(tokens, open(out, "w"))


if __name__ == "__main__":
    main(*sys.argv[1:])
