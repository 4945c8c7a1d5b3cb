"""Throughput and per-sequence memory of LoLA inside vLLM vs stock vLLM (vLLM's CPU build).

    # in the vLLM environment of integrations/vllm (see docs/guides/vllm.md), with a model folder:
    python benchmarks/vllm_serve.py --model FOLDER [--contexts 1024 4096] [--batch 2] [--decode 32]
                                    [--capacity 32] [--capacity-contexts 4096 8192] [--kv-space 4]

For each method (stock: vLLM's Llama with its paged KV cache; lola: ``LoLALlamaForCausalLM``,
window 64, sparse 64, sinks 4, chunk 64, SRE) one engine serves ``--batch`` prompts of each
context length, step by step through the engine: the time until every prompt has its first
token gives prefill tokens/s, the steps after it decode tokens/s. Memory per sequence: stock, the KV cache its tokens
occupy (2 · layers · K/V heads · head dim · bytes per element, per token); lola, its state pages
(read from the engine's layers), the same at every length. Each method runs in a subprocess
(vLLM allows one engine per process); ratios are printed against stock from the same run.
Capacity (``--capacity N``): under the same ``VLLM_CPU_KVCACHE_SPACE`` (``--kv-space`` GiB), each
method serves ``N`` distinct prompts of each ``--capacity-contexts`` length submitted at once
(``max_num_seqs`` N). Reported: the concurrency vLLM computes from its cache at start-up (requests
of ``max_model_len`` tokens its pages hold), the most sequences that decoded in one engine step
(measured: stock vLLM's paged cache fills and it queues or preempts, LoLA's pages are constant),
the wall time until every request finished, and the throughput (prompt plus generated tokens
per second, and generated tokens per second). Results are written per method and length to
``--results`` (a JSON file), and a run with the same file resumes from what it holds.
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
    from vllm.platforms import current_platform

    lola = args.method == "lola"
    kwargs = {"hf_overrides": {"architectures": ["LoLALlamaForCausalLM"], "lola": LOLA}} if lola else {}
    if not current_platform.is_cpu():  # the CPU build sizes its cache by VLLM_CPU_KVCACHE_SPACE
        kwargs["kv_cache_memory_bytes"] = int(args.kv_space * 2**30)
    # no prefix caching for either: the timed calls repeat their prompts, and lola cannot use it
    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        enforce_eager=True,
        enable_prefix_caching=False,
        max_model_len=max(args.contexts + (args.capacity_contexts if args.capacity else [])) + args.decode + 8,
        max_num_seqs=max(args.batch, args.capacity),
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
    ids = tok(FILLER * (max(args.contexts + args.capacity_contexts) // 8 + args.capacity + 8)).input_ids
    rows = {}
    cached = {int(k): v for k, v in args.done.get("speed", {}).items()}
    for ctx in args.contexts:
        if ctx in cached:
            rows[ctx] = cached[ctx]
            continue
        prompts = [{"prompt_token_ids": ids[i : i + ctx]} for i in range(args.batch)]  # distinct prompts
        llm.generate(prompts[:1], SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)  # warm-up
        prefill_s, decode_s, decoded = timed_steps(llm, prompts, args.decode)
        prefill = args.batch * ctx / prefill_s
        decode = decoded / decode_s
        per_seq = page if lola else 2 * layers * kv_heads * head_dim * element * (ctx + args.decode)
        rows[ctx] = (prefill, decode, per_seq)
        print(f"  {args.method} {ctx:>6}: prefill {prefill:8.1f} tok/s, decode {decode:7.2f} tok/s, {per_seq / 2**20:8.2f} MiB per sequence", flush=True)
        save(args, "speed", rows)
    computed = getattr(llm.llm_engine.vllm_config.cache_config, "kv_cache_max_concurrency", None)
    capacity = {int(k): v for k, v in args.done.get("capacity", {}).items()}
    for ctx in args.capacity_contexts if args.capacity else []:
        if ctx in capacity:
            continue
        prompts = [{"prompt_token_ids": ids[i : i + ctx]} for i in range(args.capacity)]
        wall, most, generated = concurrent(llm, prompts, args.decode)
        capacity[ctx] = {
            "computed": computed,
            "max_model_len": llm.llm_engine.vllm_config.model_config.max_model_len,
            "most": most,
            "wall": wall,
            "total_tps": (args.capacity * ctx + generated) / wall,
            "output_tps": generated / wall,
        }
        print(
            f"  {args.method} {ctx:>6} x {args.capacity}: at most {most} sequences decoded together (vLLM computes {computed or float('nan'):.2f}), "
            f"{wall:.0f} s, {capacity[ctx]['total_tps']:.1f} tok/s in all, {capacity[ctx]['output_tps']:.2f} generated tok/s",
            flush=True,
        )
        save(args, "capacity", capacity)
    return {"speed": rows, "capacity": capacity}


def save(args: argparse.Namespace, part: str, rows: dict) -> None:
    """Write this method's results so far (a rerun with the same --results resumes from them)."""
    args.done[part] = rows
    everything = json.load(open(args.results)) if os.path.exists(args.results) else {}
    everything[args.method] = args.done
    json.dump(everything, open(args.results, "w"), indent=1)


def submit(llm, prompts: list, max_tokens: int):
    """Add every prompt to the engine as a request of ``max_tokens`` greedy tokens (no early end);
    the engine, to step."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    tag = time.monotonic_ns()
    for i, prompt in enumerate(prompts):
        engine.add_request(f"bench-{tag}-{i}", prompt, params)
    return engine


def concurrent(llm, prompts: list, max_tokens: int) -> tuple[float, int, int]:
    """Submit every prompt at once and step the engine until all finish: ``(seconds, the most
    requests that produced a token in one step, tokens generated)``. A request produces a token
    in a step only while it is scheduled with its cache (queued and preempted requests do not),
    so the most outputs of one step is the concurrency the cache allowed."""
    engine = submit(llm, prompts, max_tokens)
    counts: dict[str, int] = {}
    most = 0
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        outs = engine.step()
        grew = [o for o in outs if len(o.outputs[0].token_ids) > counts.get(o.request_id, 0)]
        most = max(most, len(grew))
        for out in outs:
            counts[out.request_id] = len(out.outputs[0].token_ids)
    return time.perf_counter() - t0, most, sum(counts.values())


def timed_steps(llm, prompts: list, max_tokens: int) -> tuple[float, float, int]:
    """Serve ``prompts`` step by step through the engine: ``(seconds until every prompt has its
    first token, seconds after that, tokens generated after that)``. Timing the engine's steps
    separates decode from prefill (a difference of two timed calls did not: at long contexts the
    prefill's noise exceeded the whole decode)."""
    engine = submit(llm, prompts, max_tokens)
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
    parser.add_argument("--capacity", type=int, default=0, help="concurrent requests of the capacity run (0: none)")
    parser.add_argument("--capacity-contexts", type=int, nargs="+", default=[4096, 8192], help="prompt lengths of the capacity run")
    parser.add_argument(
        "--kv-space", type=float, default=4, help="cache space in GiB, the same for both methods (VLLM_CPU_KVCACHE_SPACE on CPU, kv_cache_memory_bytes on GPU)"
    )
    parser.add_argument("--results", default=None, help="JSON file of the results so far (resumed from when it exists)")
    parser.add_argument("--method", choices=("stock", "lola"), help=argparse.SUPPRESS)  # one method (subprocess)
    args = parser.parse_args()
    if args.method:
        args.done = json.load(open(args.results)).get(args.method, {}) if os.path.exists(args.results) else {}
        serve(args)
        return
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = f"{args.kv_space:g}"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    results_file = args.results or os.path.join(tempfile.gettempdir(), f"vllm_serve_{os.getpid()}.json")
    for method in ("stock", "lola"):
        command = [sys.executable, __file__, *sys.argv[1:], "--method", method]
        if not args.results:
            command += ["--results", results_file]
        subprocess.run(command, check=True)
    everything = json.load(open(results_file))
    if not args.results:
        os.remove(results_file)
    results = {m: {int(k): v for k, v in everything[m]["speed"].items()} for m in ("stock", "lola")}
    print(f"\nbatch {args.batch}, {args.decode} greedy tokens per sequence, {args.dtype}, lola {json.dumps(LOLA)}")
    print("| context | stock prefill tok/s | lola prefill tok/s | stock decode tok/s | lola decode tok/s | stock MiB/seq | lola MiB/seq |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for ctx in args.contexts:
        (sp, sd, sm), (lp, ld, lm) = results["stock"][ctx], results["lola"][ctx]
        print(f"| {ctx} | {sp:.0f} | {lp:.0f} | {sd:.1f} | {ld:.1f} | {sm / 2**20:.1f} | {lm / 2**20:.2f} |")
    for ctx in args.contexts:
        (sp, sd, sm), (lp, ld, lm) = results["stock"][ctx], results["lola"][ctx]
        print(f"at {ctx}: lola prefill {lp / sp:.2f}x stock's tokens/s, decode {ld / sd:.2f}x, memory per sequence {sm / lm:.1f}x smaller")
    if args.capacity:
        print(f"\ncapacity: {args.capacity} requests at once, {args.decode} greedy tokens each, VLLM_CPU_KVCACHE_SPACE={args.kv_space:g} GiB for both")
        print(
            "| prompt | stock: vLLM's max concurrency | lola: vLLM's max concurrency | stock: most decoding together | lola: most decoding together "
            "| stock tok/s (all) | lola tok/s (all) | stock s | lola s |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for ctx in args.capacity_contexts:
            s_, l_ = (everything[m]["capacity"][str(ctx)] for m in ("stock", "lola"))
            print(
                f"| {ctx} | {s_['computed']:.1f} | {l_['computed']:.1f} | {s_['most']} | {l_['most']} | {s_['total_tps']:.0f} | {l_['total_tps']:.0f} | {s_['wall']:.0f} | {l_['wall']:.0f} |"
            )
        for ctx in args.capacity_contexts:
            s_, l_ = (everything[m]["capacity"][str(ctx)] for m in ("stock", "lola"))
            print(
                f"at {ctx} x {args.capacity}: lola decodes {l_['most'] / s_['most']:.1f}x the sequences together, "
                f"{l_['total_tps'] / s_['total_tps']:.2f}x stock's throughput (vLLM's computed concurrency {l_['computed'] / s_['computed']:.1f}x)"
            )


if __name__ == "__main__":
    main()
