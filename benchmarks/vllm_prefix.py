"""Time to first token with a cached prefix: LoLA in vLLM with prefix caching (vLLM's CPU build).

    # in the vLLM environment of integrations/vllm, with a model folder (SmolLM2:
    # `python integrations/vllm/tests/export_smollm2.py FOLDER` in lola's environment):
    python benchmarks/vllm_prefix.py --model FOLDER [--prefix 4096] [--block-size 64] [--repeats 2]

One engine, LoLA's layers (``hf_overrides``: window 64, sparse 64, sinks 4, chunk 64, SRE, unless
the folder's ``config.json`` names the plug-in and holds its own ``lola`` entry), prefix
caching on. A prompt of ``--prefix`` tokens of filler and a question is served alone, nothing
cached (the first request); then the same prefix with another question (the second). Each is
timed until its first token (``max_tokens=1``); printed: both times, their ratio, and the tokens
the second took from the cache (``num_cached_tokens``). ``--repeats`` runs the pair again on
other filler (a prefix never seen: nothing cached for its first request) and prints each pair.
"""

from __future__ import annotations

import argparse
import json
import os
import time

LOLA = {"window": 64, "sparse_size": 64, "sinks": 4, "chunk": 64, "policy": "sre"}
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a Hugging Face Llama folder")
    p.add_argument("--prefix", type=int, default=4096, help="tokens of the shared prefix")
    p.add_argument("--block-size", type=int, default=64, help="vLLM's block_size: a state is kept every this many tokens")
    p.add_argument("--repeats", type=int, default=2, help="pairs of requests, each on a prefix of its own")
    p.add_argument("--dtype", default="float32")
    args = p.parse_args()

    from vllm import LLM, SamplingParams

    config = json.load(open(os.path.join(args.model, "config.json")))
    own = "LoLALlamaForCausalLM" in config.get("architectures", []) and "lola" in config
    overrides = None if own else {"architectures": ["LoLALlamaForCausalLM"], "lola": LOLA}
    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        enforce_eager=True,
        enable_prefix_caching=True,
        block_size=args.block_size,
        max_model_len=args.prefix + 64,
        max_num_seqs=1,
        hf_overrides=overrides,
    )
    tok = llm.get_tokenizer()
    first_token = SamplingParams(max_tokens=1, temperature=0.0)
    llm.generate(["warm-up " + FILLER], first_token, use_tqdm=False)
    print(f"LoLA {'(the folder config)' if own else json.dumps(LOLA)}, prefix {args.prefix} tokens, block_size {args.block_size}")
    for r in range(args.repeats):
        filler = tok(f"Story {r}. " + FILLER * (args.prefix // 16 + 8)).input_ids[: args.prefix]
        times, cached = [], []
        for question in (" What is the color of the sky?", " What is the color of the sun?"):
            ids = filler + tok(question).input_ids
            start = time.perf_counter()
            (out,) = llm.generate([{"prompt_token_ids": ids}], first_token, use_tqdm=False)
            times.append(time.perf_counter() - start)
            cached.append(out.num_cached_tokens or 0)
        print(
            f"  pair {r}: first {times[0]:.2f} s (cached {cached[0]}), second {times[1]:.2f} s (cached {cached[1]}): second / first {times[1] / times[0]:.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
