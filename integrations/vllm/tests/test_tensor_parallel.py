"""Tensor parallelism: two ranks, each serving its share of every LoLA layer's heads (its query
and K/V heads, its slice of the LoLA parameters, pages of its heads), give the greedy tokens and
the log-probabilities of lola's own transformers path on one device, on a folder whose LoLA
parameters differ from head to head (a rank that loaded another rank's slice would differ). Run by ../run_tests.sh once per case (one engine per
process), with VLLM_CPU_OMP_THREADS_BIND=nobind (one NUMA node for both ranks)."""

import json
import os

from cases import CONFIGS, LOGPROBS, MAX_TOKENS, close_logprobs, prompts
from lola_vllm.layer import served_heads
from vllm import LLM, SamplingParams

MODEL = os.environ["LOLA_VLLM_MODEL"]
REFERENCE = json.load(open(os.environ["LOLA_VLLM_REFERENCE"]))
CASE = os.environ["LOLA_VLLM_CASE"]


def test_two_ranks_give_the_tokens_of_one_device():
    config = json.load(open(os.path.join(MODEL, "config.json")))
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    llm = LLM(
        model=MODEL,
        dtype="float32",
        enforce_eager=True,
        max_model_len=1024,
        hf_overrides=None if CONFIGS[CASE] is None else {"architectures": ["LoLALlamaForCausalLM"], "lola": CONFIGS[CASE]},
        tensor_parallel_size=2,
        distributed_executor_backend="mp",
        max_num_seqs=2,
    )
    ranks = llm.apply_model(served_heads)
    assert len(ranks) == 2 and ranks[0] == ranks[1]  # one page layout per layer for every rank
    assert {(h, hk) for layer in ranks[0] for h, hk, _ in [layer]} == {(heads // 2, kv_heads // 2)}
    outs = llm.generate(prompts(CASE), SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, logprobs=LOGPROBS))
    assert [list(o.outputs[0].token_ids) for o in outs] == REFERENCE[CASE]
    close_logprobs(outs, REFERENCE[f"{CASE}.logprobs"])  # the ranks' outputs summed: the same distributions
