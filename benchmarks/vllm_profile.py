"""Where a prefill's time goes inside vLLM: cProfile of the engine's steps over concurrent prompts
(vLLM's CPU build, the engine in this process).

    # in the vLLM environment of integrations/vllm, with a model folder (see benchmarks/vllm_serve.py):
    python benchmarks/vllm_profile.py --model FOLDER --method lola [--prompts 4] [--context 4096] [--top 30]

Each method (``stock``: vLLM's Llama and its attention; ``lola``: ``LoLALlamaForCausalLM`` with
``benchmarks/vllm_serve.py``'s LoLA config) serves ``--prompts`` distinct prompts of
``--context`` tokens submitted at once, one greedy token each (the prefill only), after one
unprofiled warm-up prompt. Printed: the wall time and prompt tokens/s of the profiled steps,
the engine's steps (how many, and the tokens each scheduled: vLLM's chunked prefill splits
prompts by its per-step token budget), for lola the layer's calls (prefill sequences and
the batched calls they became), then the functions by own time and lola's by cumulative time.
Run one method per process (vLLM allows one engine per process); compare the two printouts.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_serve import FILLER, LOLA, submit  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a Llama-family Hugging Face folder")
    parser.add_argument("--method", choices=("stock", "lola"), required=True)
    parser.add_argument("--prompts", type=int, default=4, help="concurrent prompts")
    parser.add_argument("--context", type=int, default=4096, help="tokens per prompt")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--top", type=int, default=30, help="rows of each table")
    parser.add_argument("--kv-space", type=float, default=2, help="VLLM_CPU_KVCACHE_SPACE in GiB")
    parser.add_argument("--max-batched-tokens", type=int, help="vLLM's token budget per engine step (default: vLLM's)")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: profiled
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = f"{args.kv_space:g}"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from vllm import LLM, SamplingParams

    kwargs = {"hf_overrides": {"architectures": ["LoLALlamaForCausalLM"], "lola": LOLA}} if args.method == "lola" else {}
    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        enforce_eager=True,
        enable_prefix_caching=False,
        max_model_len=args.context + 16,
        max_num_seqs=max(args.prompts, 2),
        **({"max_num_batched_tokens": args.max_batched_tokens} if args.max_batched_tokens else {}),
        **kwargs,
    )
    ids = llm.get_tokenizer()(FILLER * (args.context // 8 + args.prompts + 8)).input_ids
    prompts = [{"prompt_token_ids": ids[i + 1 : i + 1 + args.context]} for i in range(args.prompts)]  # distinct prompts
    llm.generate([{"prompt_token_ids": ids[: args.context]}], SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)  # warm-up
    calls = None
    if args.method == "lola":
        from lola_vllm.layer import CALLS as calls

        calls.update(dict.fromkeys(calls, 0))
    engine = submit(llm, prompts, 1)
    steps: list[int] = []
    profile = cProfile.Profile()
    t0 = time.perf_counter()
    profile.enable()
    while engine.has_unfinished_requests():
        before = time.perf_counter()
        engine.step()
        steps.append(round((time.perf_counter() - before) * 1000))
    profile.disable()
    wall = time.perf_counter() - t0
    print(
        f"{args.method}: {args.prompts} prompts of {args.context} tokens in {wall:.2f} s under the profiler: {args.prompts * args.context / wall:.0f} prompt tokens/s"
    )
    budget = llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
    print(f"engine steps: {len(steps)} (token budget per step {budget}); ms per step: {steps}")
    if calls is not None:
        layers = llm.apply_model(lambda m: sum(1 for x in m.modules() if hasattr(x, "get_state_shape")))[0]
        print(
            f"lola layer calls per layer: prefill sequences {calls['prefill_seqs'] / layers:.0f}, batched prefill calls {calls['prefill_batches'] / layers:.0f}"
        )
    stats = pstats.Stats(profile)
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats("lola|attention|attn", args.top)


if __name__ == "__main__":
    main()
