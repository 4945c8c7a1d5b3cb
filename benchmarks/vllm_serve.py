"""Throughput and per-sequence memory of LoLA inside vLLM vs stock vLLM (vLLM's CPU build).

    # in the vLLM environment of integrations/vllm (see docs/guides/vllm.md), with a model folder:
    python benchmarks/vllm_serve.py --model FOLDER [--contexts 1024 4096] [--batch 2] [--decode 32]

For each method (stock: vLLM's Llama with its paged KV cache; lola: ``LoLALlamaForCausalLM``,
window 64, sparse 64, sinks 4, chunk 64, SRE) one engine serves ``--batch`` prompts of each
context length, step by step through the engine: the time until every prompt has its first
token gives prefill tokens/s, the steps after it decode tokens/s. Memory per sequence: stock, the KV cache its tokens
occupy (2 · layers · K/V heads · head dim · bytes per element, per token); lola, its state pages
(read from the engine's layers), the same at every length. Each method runs in a subprocess
(vLLM allows one engine per process); ratios are printed against stock from the same run.
SmolLM2 as a folder: ``python integrations/vllm/tests/export_smollm2.py FOLDER`` in lola's
environment.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

LOLA = {"window": 64, "sparse_size": 64, "sinks": 4, "chunk": 64, "policy": "sre"}
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


def serve(args: argparse.Namespace) -> dict:
    """One method in this process: {context: (prefill tok/s, decode tok/s, bytes per sequence)}."""
    import torch
    from vllm import LLM, SamplingParams

    lola = args.method == "lola"
    kwargs = {"hf_overrides": {"architectures": ["LoLALlamaForCausalLM"], "lola": LOLA}} if lola else {}
    # no prefix caching for either: the timed calls repeat their prompts, and lola cannot use it
    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        enforce_eager=True,
        enable_prefix_caching=False,
        max_model_len=max(args.contexts) + args.decode + 8,
        max_num_seqs=args.batch,
        **kwargs,
    )
    tok = llm.get_tokenizer()
    config = json.load(open(os.path.join(args.model, "config.json")))
    layers, kv_heads = config["num_hidden_layers"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    element = torch.empty(0, dtype=getattr(torch, args.dtype)).element_size()
    page = None
    if lola:
        page = sum(
            llm.apply_model(
                lambda model: sum(
                    int(torch.tensor(s).prod()) * torch.empty(0, dtype=d).element_size()
                    for m in model.modules()
                    if hasattr(m, "get_state_shape")
                    for s, d in zip(m.get_state_shape(), m.get_state_dtype())
                )
            )
        )
    ids = tok(FILLER * (max(args.contexts) // 8 + 8)).input_ids
    rows = {}
    for ctx in args.contexts:
        prompts = [{"prompt_token_ids": ids[i : i + ctx]} for i in range(args.batch)]  # distinct prompts
        llm.generate(prompts[:1], SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)  # warm-up
        prefill_s, decode_s, decoded = timed_steps(llm, prompts, args.decode)
        prefill = args.batch * ctx / prefill_s
        decode = decoded / decode_s
        per_seq = page if lola else 2 * layers * kv_heads * head_dim * element * (ctx + args.decode)
        rows[ctx] = (prefill, decode, per_seq)
        print(f"  {args.method} {ctx:>6}: prefill {prefill:8.1f} tok/s, decode {decode:7.2f} tok/s, {per_seq / 2**20:8.2f} MiB per sequence", flush=True)
    return rows


def timed_steps(llm, prompts: list, max_tokens: int) -> tuple[float, float, int]:
    """Serve ``prompts`` step by step through the engine: ``(seconds until every prompt has its
    first token, seconds after that, tokens generated after that)``. Timing the engine's steps
    separates decode from prefill (a difference of two timed calls did not: at long contexts the
    prefill's noise exceeded the whole decode)."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    tag = time.monotonic_ns()
    for i, prompt in enumerate(prompts):
        engine.add_request(f"bench-{tag}-{i}", prompt, params)
    counts: dict[str, int] = {}
    t0 = time.perf_counter()
    first, at_first = None, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            counts[out.request_id] = len(out.outputs[0].token_ids)
        if first is None and len(counts) == len(prompts) and min(counts.values()) > 0:
            first, at_first = time.perf_counter(), sum(counts.values())
    end = time.perf_counter()
    return first - t0, end - first, sum(counts.values()) - at_first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a Llama-family Hugging Face folder")
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--batch", type=int, default=2, help="sequences served together")
    parser.add_argument("--decode", type=int, default=32, help="greedy tokens per sequence")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--method", choices=("stock", "lola"), help=argparse.SUPPRESS)  # one method (subprocess)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.method:
        json.dump(serve(args), open(args.json, "w"))
        return
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    results = {}
    for method in ("stock", "lola"):
        out = os.path.join(tempfile.gettempdir(), f"vllm_serve_{os.getpid()}_{method}.json")
        subprocess.run([sys.executable, __file__, *sys.argv[1:], "--method", method, "--json", out], check=True)
        results[method] = {int(k): v for k, v in json.load(open(out)).items()}
        os.remove(out)
    print(f"\nbatch {args.batch}, {args.decode} greedy tokens per sequence, {args.dtype}, lola {json.dumps(LOLA)}")
    print("| context | stock prefill tok/s | lola prefill tok/s | stock decode tok/s | lola decode tok/s | stock MiB/seq | lola MiB/seq |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for ctx in args.contexts:
        (sp, sd, sm), (lp, ld, lm) = results["stock"][ctx], results["lola"][ctx]
        print(f"| {ctx} | {sp:.0f} | {lp:.0f} | {sd:.1f} | {ld:.1f} | {sm / 2**20:.1f} | {lm / 2**20:.2f} |")
    for ctx in args.contexts:
        (sp, sd, sm), (lp, ld, lm) = results["stock"][ctx], results["lola"][ctx]
        print(f"at {ctx}: lola prefill {lp / sp:.2f}x stock's tokens/s, decode {ld / sd:.2f}x, memory per sequence {sm / lm:.1f}x smaller")


if __name__ == "__main__":
    main()
