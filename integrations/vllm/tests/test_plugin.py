"""lola-attention-vllm in vLLM's CPU build: greedy tokens equal lola's transformers path, the state per
sequence is one fixed page, unsupported features are refused. Run by ../run_tests.sh, which
builds the model and the reference tokens and runs this module once per case
(LOLA_VLLM_MODEL, LOLA_VLLM_REFERENCE, LOLA_VLLM_CASE): vLLM allows one engine per process."""

import json
import os

import pytest
import torch
from cases import CONFIGS, LOGPROBS, MAX_TOKENS, PROMPTS, close_logprobs, prompts
from vllm import LLM, SamplingParams

MODEL = os.environ["LOLA_VLLM_MODEL"]
REFERENCE = json.load(open(os.environ["LOLA_VLLM_REFERENCE"]))
CASE = os.environ["LOLA_VLLM_CASE"]


def _llm(cfg: dict | None, **kwargs) -> LLM:
    # cfg None: the folder's config.json names the architecture and holds the LoLA config
    overrides = None if cfg is None else {"architectures": ["LoLALlamaForCausalLM"], "lola": cfg}
    return LLM(model=MODEL, dtype="float32", enforce_eager=True, max_model_len=1024, hf_overrides=overrides, **kwargs)


def _state_tensors(model) -> list:
    return [(tuple(t.shape), t.dtype, t.data_ptr()) for m in model.modules() if hasattr(m, "get_state_shape") for t in m.kv_cache]


@pytest.fixture(scope="module")
def llm():
    # four prompts, two slots: continuous batching, and slots reused by later requests
    return _llm(CONFIGS[CASE], max_num_seqs=2)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"enable_prefix_caching": True}, "pass block_size explicitly"),
        ({"enable_prefix_caching": True, "block_size": 32, "enable_chunked_prefill": False}, "needs chunked prefill"),
        ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2}}, "speculative decoding is not supported"),
    ],
)
def test_unsupported_features_are_refused_with_a_message(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _llm(CONFIGS[CASE], **kwargs)


def test_tensor_parallel_sizes_that_would_not_split_the_heads_evenly_are_refused():
    if CASE == "saved":  # SmolLM2: 3 K/V heads
        with pytest.raises(ValueError, match="splits the model's 3 K/V heads unevenly"):
            _llm(None, tensor_parallel_size=2)
    else:  # per-head sparse sizes 8 and 24: the two ranks' pages would differ
        with pytest.raises(ValueError, match=r"sparse_size_per_head \[8, 24\] gives the 2 ranks' shares"):
            _llm(CONFIGS["ragged"], tensor_parallel_size=2)


def test_greedy_tokens_equal_lolas_own_transformers_path(llm):
    from lola_vllm.layer import CALLS

    before = dict(CALLS)
    outs = llm.generate(prompts(CASE), SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, logprobs=LOGPROBS))
    assert [list(o.outputs[0].token_ids) for o in outs] == REFERENCE[CASE]
    close_logprobs(outs, REFERENCE[f"{CASE}.logprobs"])  # not only the argmax: the distributions
    # LoLA served: prefills and decodes batched (two slots: the first two prompts prefill together,
    # in one call when they are of one length), every new request's slot reset
    assert CALLS["prefill_seqs"] > before["prefill_seqs"] and CALLS["decode_rows"] > before["decode_rows"]
    first = [len(llm.get_tokenizer()(p).input_ids) for p in prompts(CASE)[:2]]
    if first[0] == first[1]:
        assert CALLS["prefill_batches"] - before["prefill_batches"] < CALLS["prefill_seqs"] - before["prefill_seqs"]
    assert CALLS["resets"] - before["resets"] >= len(prompts(CASE))
    # decode steps of the same running batch continue its bound state: rows are bound to their
    # pages when the batch changes, not every step (the tokens above hold the pages current)
    binds, live = (CALLS[k] - before[k] for k in ("page_binds", "live_steps"))
    assert live > 2 * binds > 0, (live, binds)


def test_the_state_of_a_sequence_does_not_grow(llm):
    before = llm.apply_model(_state_tensors)
    out = llm.generate([PROMPTS[-1] + PROMPTS[0]], SamplingParams(max_tokens=96, temperature=0.0, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 96  # 916 tokens seen: far past window + sparse cache
    assert llm.apply_model(_state_tensors) == before  # the same pages, same shapes, same storage

    def bound_in_place(model):
        # one running sequence: its row is one range of pages, so the state decoding it is the
        # page itself (a view: written in place, nothing copied or allocated per step)
        found = []
        for m in model.modules():
            if hasattr(m, "get_state_shape") and m._live is not None:
                slot, mem = int(m._live[0][0]), m._live[2]
                page = m.kv_cache[m._keys.index("slots.k")]
                found.append(mem.bound_pages.start == slot and mem.slots.whole.k.data_ptr() == page[slot].data_ptr())
        return found

    assert all(llm.apply_model(bound_in_place)[0]) and llm.apply_model(bound_in_place)[0]


def test_the_state_page_is_lolas_state_for_one_row(llm):
    import lola

    def page_bytes(model):
        return [
            sum(int(torch.tensor(s).prod()) * torch.empty(0, dtype=d).element_size() for s, d in zip(m.get_state_shape(), m.get_state_dtype()))
            for m in model.modules()
            if hasattr(m, "get_state_shape")
        ]

    from lola.engine.state_checks import describe_layout, layout_width
    from lola.pretrained.resolve import resolve_config

    config = json.load(open(os.path.join(MODEL, "config.json")))
    h, hkv, layers = config["num_attention_heads"], config["num_key_value_heads"], config["num_hidden_layers"]
    d = config["hidden_size"] // h
    cfg = resolve_config(config["lola"] if CONFIGS[CASE] is None else CONFIGS[CASE])
    expected = []
    for layer in range(layers):  # per-layer sizes (calibrated budgets) give pages of their own size
        # (a page's size does not depend on how positions are read: composed without the model's rotary)
        sized = cfg.for_layer(layer).model_copy(update={"positions": "absolute", "exact_distance": None, "state_positions": None})
        attn = lola.compose(sized, num_heads=h, head_dim=d, num_kv_heads=hkv, layer=layer)
        _, state = attn(torch.randn(1, 3, h, d), torch.randn(1, 3, hkv, d), torch.randn(1, 3, hkv, d))
        layout = layout_width(describe_layout(state))  # the layout descriptor's page, stamped at bind
        expected.append(state.nbytes() - 8 + layout)  # all but the row's token count
    assert llm.apply_model(page_bytes) == [expected]


@pytest.mark.skipif(CONFIGS[CASE] is not None, reason="the saved case: a folder with trained LoLA weights")
def test_the_trained_lola_weights_of_the_folder_are_the_ones_served(llm):
    from safetensors import safe_open

    def lola_parameters(model):
        return {n: p.detach().float().clone() for n, p in model.named_parameters() if ".lola." in n}

    served = llm.apply_model(lola_parameters)[0]
    saved = {}
    for name in sorted(os.listdir(MODEL)):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(MODEL, name), framework="pt") as f:
                saved.update({k: f.get_tensor(k).float() for k in f.keys() if ".lola." in k})
    assert saved and served.keys() == saved.keys()  # feature maps and window factors of every layer, by name
    assert all(torch.equal(served[k], saved[k]) for k in saved)
