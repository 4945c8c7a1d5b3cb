"""lola-attention-vllm with bounded positions, past the model's context: a tiny model of 256
positions, exported with positions='bounded', served with max_model_len 1024 gives lola's own
transformers tokens on prompts of 600 and 900 tokens; absolute positions past the context are
refused. Run by ../run_tests.sh (LOLA_VLLM_MODEL, LOLA_VLLM_REFERENCE)."""

import json
import os

import pytest
from cases import BOUNDED, LOGPROBS, MAX_TOKENS, close_logprobs, prompts
from vllm import LLM, SamplingParams

MODEL = os.environ["LOLA_VLLM_MODEL"]
REFERENCE = json.load(open(os.environ["LOLA_VLLM_REFERENCE"]))


def test_absolute_positions_past_the_context_are_refused():
    absolute = {**BOUNDED, "positions": "absolute", "exact_distance": None, "state_positions": None}
    with pytest.raises(ValueError, match=r"max_model_len 1024 is past the model's 256 positions"):
        LLM(model=MODEL, dtype="float32", enforce_eager=True, max_model_len=1024, hf_overrides={"lola": absolute})


def test_a_stream_past_the_models_context_equals_lolas_transformers_path():
    llm = LLM(model=MODEL, dtype="float32", enforce_eager=True, max_model_len=1024, max_num_seqs=2)
    assert all(len(llm.get_tokenizer()(p).input_ids) > 256 for p in prompts("bounded"))
    outs = llm.generate(prompts("bounded"), SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, logprobs=LOGPROBS))
    assert [list(o.outputs[0].token_ids) for o in outs] == REFERENCE["bounded"]
    close_logprobs(outs, REFERENCE["bounded.logprobs"])
