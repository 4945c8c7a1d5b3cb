"""Prefix caching (vLLM's Mamba ``align`` mode): a request sharing a prefix with an earlier one
resumes from the LoLA state cached at the last shared block boundary, skips that prefill, and
yields the tokens of lola's own transformers path. Run by ../run_tests.sh once (one engine per
process), on a config whose pages include the linear state and a ragged sparse run."""

import json
import os

from cases import CONFIGS, MAX_TOKENS, PROMPTS
from vllm import LLM, SamplingParams

MODEL = os.environ["LOLA_VLLM_MODEL"]
REFERENCE = json.load(open(os.environ["LOLA_VLLM_REFERENCE"]))
CASE = os.environ["LOLA_VLLM_CASE"]
BLOCK = 32


def test_a_shared_prefix_resumes_from_the_cached_state_with_the_same_tokens():
    from lola_vllm.layer import CALLS

    llm = LLM(
        model=MODEL,
        dtype="float32",
        enforce_eager=True,
        max_model_len=1024,
        hf_overrides={"architectures": ["LoLALlamaForCausalLM"], "lola": CONFIGS[CASE]},
        enable_prefix_caching=True,
        block_size=BLOCK,
        max_num_seqs=2,
    )
    tokens = lambda p: len(llm.get_tokenizer()(p).input_ids)  # noqa: E731
    assert PROMPTS[4].startswith(PROMPTS[0]) and PROMPTS[0].startswith(PROMPTS[2])

    def run(i, skip=False):
        """Tokens (checked against lola's transformers path), the top-3 logprobs of every step,
        tokens served from the cache, pages reset."""
        resets = CALLS["resets"]
        greedy = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, logprobs=3, skip_reading_prefix_cache=skip)
        (out,) = llm.generate([PROMPTS[i]], greedy)
        got = out.outputs[0]
        assert list(got.token_ids) == REFERENCE[CASE][i], i
        logprobs = [sorted(x.logprob for x in step.values()) for step in got.logprobs]
        return logprobs, out.num_cached_tokens or 0, CALLS["resets"] - resets

    def hit(i, expected):
        """Prompt ``i`` resumes from the state cached at ``expected`` tokens, and its logprobs are
        those of the same prompt read from its first token (the cache skipped)."""
        cached_run, cached, resets = run(i)
        assert cached == expected > 0 and resets == 0, (i, cached, expected)
        full_run, skipped, resets = run(i, skip=True)
        assert skipped == 0 and resets > 0  # (one per layer)
        for a, b in zip(cached_run, full_run):
            assert max(abs(x - y) for x, y in zip(a, b)) < 1e-4, (i, a, b)

    # vLLM keeps one state per request: at the last block boundary of its prompt
    _, cached, resets = run(2)
    assert cached == 0 and resets > 0  # nothing cached yet: a new state (one reset per layer)
    boundary = lambda i: (tokens(PROMPTS[i]) - 1) // BLOCK * BLOCK  # noqa: E731
    hit(0, boundary(2))  # PROMPTS[2] is a prefix of PROMPTS[0]: it resumes from that state
    hit(4, boundary(0))  # and PROMPTS[0] of PROMPTS[4]: a state that a resumed request left
    hit(0, boundary(0))  # the same prompt again: all but its last block skipped
