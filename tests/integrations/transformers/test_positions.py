"""Streams past a model's context through transformers: bounded positions accept them, absolute
positions and full attention keep refusing them."""

import pytest
import torch

import lola
from lola.integrations.transformers import LoLACache, apply_lola
from tests.integrations.transformers.conftest import left_padded, tiny
from tests.oracles import assert_rel_close

CONTEXT = 48
BOUNDED = lola.LoLAConfig(window=6, sparse_size=5, sinks=2, chunk=4, positions="bounded")


def short_model(config=BOUNDED):
    return apply_lola(tiny("llama", max_position_embeddings=CONTEXT), config)


def test_apply_fills_the_limits_from_the_model_and_takes_its_rotation():
    model = short_model()
    cfg = model._lola.config
    assert (cfg.exact_distance, cfg.state_positions) == (CONTEXT - BOUNDED.chunk, CONTEXT)
    layer = model._lola.modules[0]
    assert torch.equal(layer.positions.rotary.inv_freq, model.model.rotary_emb.inv_freq.double())
    own = short_model(BOUNDED.model_copy(update={"exact_distance": 10, "state_positions": 7}))
    assert (own._lola.config.exact_distance, own._lola.config.state_positions) == (10, 7)


def test_generate_runs_past_the_context_and_left_padding_reads_as_rows_alone():
    model = short_model()
    ids, mask = left_padded(batch=3, length=3 * CONTEXT)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
        assert out.shape[1] == 3 * CONTEXT + 6
        for row in range(3):
            alone = ids[row, mask[row].bool()][None]
            mine = model.generate(alone, max_new_tokens=6, do_sample=False)
            assert torch.equal(mine[0, -6:], out[row, -6:])


def test_a_prefill_then_tokens_one_by_one_equals_one_forward_past_the_context():
    model = short_model()
    ids = torch.randint(0, 101, (2, 2 * CONTEXT + 9))
    with torch.no_grad():
        whole = model(ids, use_cache=False).logits
        cache = LoLACache(model)
        parts = [model(ids[:, :CONTEXT], cache=cache).logits]
        for i in range(CONTEXT, ids.shape[1]):
            parts.append(model(ids[:, i : i + 1], cache=cache).logits)
    assert_rel_close(whole, torch.cat(parts, dim=1), 1e-4)


def test_absolute_positions_keep_refusing():
    model = short_model(lola.LoLAConfig(window=6, sparse_size=5, sinks=2, chunk=4))
    with pytest.raises(ValueError, match=r"max_position_embeddings \(48\).*positions='bounded'"):
        model.generate(torch.randint(0, 101, (1, CONTEXT)), max_new_tokens=4, do_sample=False)


def test_a_full_attention_layer_keeps_the_refusal():
    model = short_model(BOUNDED.model_copy(update={"full_attention_layers": [1]}))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model.generate(torch.randint(0, 101, (1, CONTEXT)), max_new_tokens=4, do_sample=False)


def test_positions_other_than_the_counts_of_real_tokens_are_refused():
    model = short_model()
    ids, mask = left_padded(batch=2, length=20)
    with pytest.raises(ValueError, match="bounds its positions.*other position_ids"):
        model(ids, attention_mask=mask, cache=LoLACache(model))  # positions 0..19 on the padded row
    positions = (mask.cumsum(1) - 1).clamp_min(0)
    with torch.no_grad():
        model(ids, attention_mask=mask, position_ids=positions, cache=LoLACache(model))


def test_positions_found_right_once_are_compared_again_when_anything_moved():
    # The check runs once per forward (one position_ids for every layer): a tensor that was
    # right for one call, given again to a cache that has seen more or changed in place, is
    # compared again.
    model = short_model()
    ids = torch.randint(0, 101, (2, 20))
    positions = torch.arange(20).repeat(2, 1)
    cache = LoLACache(model)
    with torch.inference_mode():  # (inference tensors: no version counter)
        model(ids, position_ids=positions, cache=cache)
        with pytest.raises(ValueError, match="bounds its positions.*other position_ids"):
            model(ids, position_ids=positions, cache=cache)  # the counts moved on
        positions.add_(1)
        with pytest.raises(ValueError, match="bounds its positions.*other position_ids"):
            model(ids, position_ids=positions, cache=LoLACache(model))  # changed in place
        model(ids, position_ids=positions.sub_(1), cache=LoLACache(model))


@pytest.mark.parametrize(
    "arch, overrides, match",
    [
        ("llama", dict(rope_scaling={"rope_type": "dynamic", "factor": 4.0}), "does not reproduce the model's RoPE"),
        ("cohere", {}, "does not reproduce the model's RoPE"),  # interleaved pairs
        ("smollm3", dict(no_rope_layers=[1, 0], vocab_size=128256), "skips RoPE in some layers"),
    ],
)
def test_a_rotation_the_delta_cannot_reproduce_is_refused(arch, overrides, match):
    import transformers

    config = transformers.AutoConfig.for_model(
        arch, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, **{"vocab_size": 101, **overrides}
    )
    model = transformers.AutoModelForCausalLM.from_config(config)
    before = {n: b.clone() for n, b in model.named_buffers()}
    with pytest.raises(ValueError, match=match):
        lola.RotaryEmbedding.from_model(model)
    assert all(torch.equal(b, before[n]) for n, b in model.named_buffers())  # the check left the model as it was


@pytest.mark.parametrize(
    "scaling",
    [
        None,
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    ],
)
def test_scaled_rope_of_fixed_frequencies_is_taken(scaling):
    model = tiny("llama", max_position_embeddings=64, **({"rope_scaling": scaling} if scaling else {}))
    rot = lola.RotaryEmbedding.from_model(model)
    assert torch.equal(rot.inv_freq, model.model.rotary_emb.inv_freq.double())


def test_a_forward_past_the_context_is_refused_unless_every_layer_bounds_its_positions():
    # generate() refused it already; a plain forward (or a decode step by hand) did not
    model = tiny("llama")
    model.config.max_position_embeddings = 64
    ids = torch.randint(0, 100, (1, 70))
    absolute = lola.LoLAConfig(window=8, sparse_size=8, sinks=2, chunk=8)
    for cfg in (absolute, absolute.model_copy(update={"positions": "bounded", "full_attention_layers": [0]})):
        with lola.patch(model, cfg), pytest.raises(ValueError, match=r"this forward would feed positions up to 70 .* max_position_embeddings \(64\)"):
            model(ids, cache=LoLACache(model))
    with lola.patch(model, absolute):
        cache = LoLACache(model)
        with torch.no_grad():
            model(ids[:, :64], cache=cache)
        with pytest.raises(ValueError, match=r"up to 65 \(64 in the cache and 1 now\)"):
            model(ids[:, 64:65], cache=cache)
    with lola.patch(model, absolute.model_copy(update={"positions": "bounded"})), torch.no_grad():
        assert torch.isfinite(model(ids, cache=LoLACache(model)).logits).all()


def test_bounded_limits_past_the_model_s_context_are_refused():
    from lola.pretrained.resolve import resolve_positions

    cfg = lola.LoLAConfig(window=8, sparse_size=8, chunk=8, positions="bounded")
    assert resolve_positions(cfg.model_copy(update={"exact_distance": 56}), 64).exact_distance == 56
    with pytest.raises(ValueError, match=r"exact_distance 57 lets exact reads see distances up to 64, past the model's 64 positions .* at most 56"):
        resolve_positions(cfg.model_copy(update={"exact_distance": 57}), 64)
    with pytest.raises(ValueError, match=r"state_positions 65 is past the model's 64 positions"):
        resolve_positions(cfg.model_copy(update={"state_positions": 65}), 64)


def test_a_prefill_chunk_keeps_bounded_reads_inside_the_model_s_context():
    """A prefill block of P tokens reads at one position, so exact reads see distances up to
    exact_distance + P - 1: the limit left unset and the refusal both count P."""
    from lola.pretrained.resolve import resolve_positions

    cfg = lola.LoLAConfig(window=8, sparse_size=8, chunk=8, positions="bounded", schedule_kwargs={"prefill_chunk": 32})
    assert resolve_positions(cfg, 128).exact_distance == 128 - 32
    with pytest.raises(ValueError, match=r"exact_distance 97 lets exact reads see distances up to 128, .* at most 96"):
        resolve_positions(cfg.model_copy(update={"exact_distance": 97}), 128)
