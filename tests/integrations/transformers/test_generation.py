"""generate() without a cache argument, stale and foreign caches, and lola.patch."""

import pytest
import torch
from transformers import DynamicCache

import lola
from lola.integrations.transformers import LoLACache, apply_lola, patch, remove_lola
from tests.integrations.transformers.conftest import left_padded, tiny

SMALL = lola.LoLAConfig(window=6, sparse_size=5, sinks=2, chunk=4)


@pytest.mark.parametrize(
    "options",
    [dict(do_sample=False), dict(do_sample=True, top_k=20), dict(num_beams=3, do_sample=False)],
    ids=["greedy", "sampled", "beam"],
)
def test_plain_generate_equals_an_explicit_lola_cache(options):
    model = apply_lola(tiny("llama"), SMALL)
    ids, mask = left_padded(length=25)
    with torch.no_grad():
        torch.manual_seed(0)
        explicit = model.generate(ids, attention_mask=mask, max_new_tokens=10, cache=LoLACache(model), **options)
        torch.manual_seed(0)
        plain = model.generate(ids, attention_mask=mask, max_new_tokens=10, **options)
    assert torch.equal(plain, explicit)
    # and a stateless run of the same sequences: the cache LoLA built was a LoLA cache
    if not options.get("do_sample") and "num_beams" not in options:
        for row in range(ids.shape[0]):
            seq = plain[row, torch.cat([mask[row].bool(), torch.ones(10, dtype=torch.bool)])]
            assert torch.equal(model(seq[None, :-1], use_cache=False).logits[0, -10:].argmax(-1), seq[-10:])


def test_generate_returns_the_lola_cache_it_built():
    model = apply_lola(tiny("llama"), SMALL)
    with torch.no_grad():
        out = model.generate(torch.randint(0, 101, (1, 30)), max_new_tokens=4, do_sample=False, return_dict_in_generate=True)
    assert isinstance(out.past_key_values, LoLACache)


def test_a_cache_lola_cannot_use_is_refused_before_any_compute():
    model = apply_lola(tiny("llama"), SMALL)
    ids = torch.randint(0, 101, (1, 12))
    with pytest.raises(ValueError, match="needs a lola LoLACache, got a DynamicCache"):
        model.generate(ids, max_new_tokens=3, cache=DynamicCache(config=model.config))
    with pytest.raises(ValueError, match="does not apply to a LoLA model"):
        model.generate(ids, max_new_tokens=3, cache_implementation="static")


def test_forward_calls_with_a_dynamic_cache_get_a_clear_error():
    model = apply_lola(tiny("llama"), SMALL)
    ids = torch.randint(0, 101, (1, 12))
    with torch.no_grad():
        out = model(ids, use_cache=True)  # transformers builds a DynamicCache: fine for one call
        assert not isinstance(out.past_key_values, LoLACache)
        with pytest.raises(ValueError, match=r"keeps past keys.*cache=LoLACache\(model\)"):
            model(ids[:, -1:], cache=out.past_key_values)


def test_stale_and_foreign_caches_are_refused():
    model = apply_lola(tiny("llama"), SMALL)
    ids = torch.randint(0, 101, (1, 12))
    cache = LoLACache(model)
    with torch.no_grad():
        model(ids, cache=cache)
        remove_lola(model)
        with pytest.raises(ValueError, match="stale"):
            model(ids[:, -1:], cache=cache)
        apply_lola(model, SMALL)  # re-applied: the old states belong to layers that are gone
        with pytest.raises(ValueError, match="stale"):
            model(ids[:, -1:], cache=cache)
        other = apply_lola(tiny("llama"), SMALL)
        with pytest.raises(ValueError, match="built for another model"):
            other.generate(ids, max_new_tokens=2, cache=LoLACache(model))


def test_generate_after_remove_lola_is_stock_again():
    stock = tiny("llama")
    ids = torch.randint(0, 101, (2, 16))
    with torch.no_grad():
        expected = stock.generate(ids, max_new_tokens=6, do_sample=False)
        remove_lola(apply_lola(stock, SMALL))
        assert "_prepare_cache_for_generation" not in vars(stock)
        assert torch.equal(stock.generate(ids, max_new_tokens=6, do_sample=False), expected)


def test_patch_applies_and_always_removes():
    model = tiny("llama")
    with lola.patch(model, SMALL) as patched:
        assert patched is model and model._lola.config == SMALL
    assert getattr(model, "_lola", None) is None and not hasattr(model.config, "lola")
    with pytest.raises(RuntimeError, match="boom"):
        with patch(model, SMALL):
            raise RuntimeError("boom")
    assert getattr(model, "_lola", None) is None
    assert model.config._attn_implementation == "sdpa"


def test_a_text_generation_pipeline_gets_a_lola_cache():
    from transformers import pipeline

    from lola.integrations.lm_eval.model import byte_tokenizer

    tok = byte_tokenizer()
    model = apply_lola(tiny("llama", vocab_size=256), SMALL)
    prompt = "The pass key is 71432. Remember it. " * 2
    generator = pipeline("text-generation", model=model, tokenizer=tok)
    text = generator(prompt, max_new_tokens=12, do_sample=False, return_full_text=False)[0]["generated_text"]
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=12, do_sample=False, cache=LoLACache(model))
    assert text == tok.decode(expected[0, ids.shape[1] :], skip_special_tokens=True)
    assert ids.shape[1] > SMALL.exact_budget  # long enough for LoLA to evict


@pytest.mark.parametrize("padded", [False, True], ids=["no padding", "left padding"])
def test_generate_reads_at_most_the_padding_mask_back_per_token(monkeypatch, padded):
    """Between steps a decoded token reads nothing back from lola's code, whatever the number of
    layers; a left-padded batch reads its padding mask once per forward (transformers builds one
    mask for every layer), not once per layer. Checks run as on an accelerator (asynchronous)."""
    from transformers import LogitsProcessor

    import lola.core.checks as checks
    from tests.host_reads import count_host_reads

    monkeypatch.setattr(checks, "HOST_DEVICES", frozenset())  # the CPU as an accelerator
    model = tiny("llama", layers=3)
    apply_lola(model, lola.LoLAConfig(window=8, sparse_size=8, sinks=2, chunk=64, mixing="lola_authors"))
    ids = torch.randint(1, 100, (2, 30), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    if padded:
        mask[0, :4] = 0
    per_token = []

    class Mark(LogitsProcessor):  # called once per forward, after it
        def __call__(self, input_ids, scores):
            per_token.append(sum(reads.values()))
            return scores

    with count_host_reads() as reads, torch.no_grad():
        model.generate(ids, attention_mask=mask, max_new_tokens=12, min_new_tokens=12, do_sample=False, logits_processor=[Mark()], pad_token_id=0)
    # per_token[0]: the prefill; [1]: the first decoded token reads each layer's counts once;
    # after it, the prompt (≤ 30 tokens) and 12 new ones stay below the first step (position 63).
    decoded = [b - a for a, b in zip(per_token[1:], per_token[2:])]
    assert len(decoded) == 10 and all(n == (1 if padded else 0) for n in decoded), decoded


@pytest.mark.parametrize("shape", [(2, 10), (2, 14), (3, 12)])
def test_an_attention_mask_of_another_shape_is_refused(shape):
    # all ones: generate would drop it after deriving the positions from it (shifted by 2 for 14)
    model = apply_lola(tiny("llama"), SMALL)
    ids = torch.randint(0, 101, (2, 12))
    with pytest.raises(ValueError, match=rf"attention_mask has shape \({shape[0]}, {shape[1]}\), expected \(2, 12\)"):
        model.generate(ids, attention_mask=torch.ones(shape, dtype=torch.long), max_new_tokens=2, do_sample=False)
    with pytest.raises(ValueError, match=rf"attention_mask has shape \({shape[0]}, {shape[1]}\), expected \(2, 12\)"):
        model(ids, attention_mask=torch.ones(shape, dtype=torch.long))
    # with a cache the mask covers the cached tokens too
    cache = LoLACache(model)
    with torch.no_grad():
        model(ids, attention_mask=torch.ones(2, 12, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match=r"expected \(2, 13\).*1 new \+ 12 cached"):
            model(ids[:, :1], attention_mask=torch.ones(2, 1, dtype=torch.long), cache=cache)
        model(ids[:, :1], attention_mask=torch.ones(2, 13, dtype=torch.long), cache=cache)


def test_generate_refuses_to_run_past_the_models_positions():
    model = apply_lola(tiny("llama"), SMALL)
    most = model.config.max_position_embeddings
    ids = torch.randint(0, 101, (1, most - 4))
    with pytest.raises(ValueError, match=rf"feed {most + 1} positions.*max_position_embeddings \({most}\)"):
        model.generate(ids, max_new_tokens=6, do_sample=False)
    # the last new token is never fed: prompt + new tokens = positions + 1 is allowed
    model.config.max_position_embeddings = 40
    with torch.no_grad():
        out = model.generate(ids[:, :36], max_new_tokens=5, do_sample=False)
    assert out.shape[1] == 41


@pytest.mark.parametrize(
    "ids, error, match",
    [
        (torch.zeros(0, 5, dtype=torch.long), ValueError, r"input_ids must hold at least one sequence, got an empty batch of shape \(0, 5\)"),
        (torch.zeros(1, 5), TypeError, "input_ids must be an integer tensor of token ids, got torch.float32"),
        (torch.tensor([[1, 2, 101, 3]]), ValueError, r"token id 101, outside the model's vocabulary \[0, 101\)"),
        (torch.tensor([[1, -1, 3]]), ValueError, r"token id -1, outside the model's vocabulary"),
    ],
    ids=["empty batch", "float ids", "past the vocabulary", "negative"],
)
def test_input_ids_a_model_cannot_embed_are_refused_by_name(ids, error, match):
    model = apply_lola(tiny("llama"), SMALL)
    assert model.get_input_embeddings().num_embeddings == 101
    with pytest.raises(error, match=match):
        model.generate(ids, max_new_tokens=2, do_sample=False)
    with pytest.raises(error, match=match), torch.no_grad():
        model(ids)
    with torch.no_grad():
        model(torch.tensor([[0, 100, 7]]))  # the vocabulary's ends are fine


def test_generate_with_a_prefill_chunk_reads_each_row_as_alone_in_the_bytes_of_the_decode_chunk():
    """generate()'s prefill steps every prefill chunk, its decoding every chunk: a left-padded
    batch generates what each row generates alone, and the cache holds the bytes of the plain
    chunk's."""
    model = apply_lola(tiny("llama"), SMALL.model_copy(update={"schedule_kwargs": {"prefill_chunk": 12}}))
    ids, mask = left_padded(length=40)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=9, do_sample=False, return_dict_in_generate=True)
        for row in range(ids.shape[0]):
            alone = model.generate(ids[row : row + 1, mask[row].bool()], max_new_tokens=9, do_sample=False)
            assert torch.equal(alone[0, -9:], out.sequences[row, -9:]), row
        plain = apply_lola(tiny("llama"), SMALL)
        base = plain.generate(ids, attention_mask=mask, max_new_tokens=9, do_sample=False, return_dict_in_generate=True)
    assert out.past_key_values.nbytes() == base.past_key_values.nbytes()
