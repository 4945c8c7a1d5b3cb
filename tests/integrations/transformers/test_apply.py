import pytest
import torch

import lola
from lola.integrations.transformers import LoLACache, apply_lola, remove_lola
from tests.integrations.transformers.conftest import left_padded, tiny
from tests.oracles import assert_rel_close

ARCHS = ["llama", "mistral", "qwen2"]
BIG = lola.LoLAConfig(window=64, sparse_size=64, sinks=4, chunk=16)  # nothing evicted below 132 tokens
SMALL = lola.LoLAConfig(window=6, sparse_size=5, sinks=2, chunk=4)


def real(x, mask):
    return x[mask.bool()]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("padded", [False, True])
def test_nothing_evicted_equals_stock_sdpa(arch, padded):
    model = tiny(arch)
    ids, mask = left_padded()
    if not padded:
        mask = torch.ones_like(mask)
    with torch.no_grad():
        ref = model(ids, attention_mask=mask).logits
        apply_lola(model, BIG)
        stateless = model(ids, attention_mask=mask).logits
        cached = model(ids, attention_mask=mask, cache=LoLACache(model)).logits
    torch.testing.assert_close(real(stateless, mask), real(ref, mask), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(real(cached, mask), real(ref, mask), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_then_decode_equals_one_forward(arch):
    model = apply_lola(tiny(arch), SMALL)
    ids, mask = left_padded(length=37)
    with torch.no_grad():
        whole = model(ids, attention_mask=mask, cache=LoLACache(model)).logits
        cache = LoLACache(model)
        parts = [model(ids[:, :21], attention_mask=mask[:, :21], cache=cache).logits]
        for t in range(21, 37):
            parts.append(model(ids[:, t : t + 1], attention_mask=mask[:, : t + 1], cache=cache).logits)
    assert cache.get_seq_length() == 37
    assert_rel_close(real(whole, mask), real(torch.cat(parts, 1), mask), 1e-4)


def test_left_padded_batch_equals_each_row_alone():
    model = apply_lola(tiny("llama"), SMALL)
    ids, mask = left_padded(length=45)
    # RoPE positions count real tokens, as generate() does; feature maps see rotated q/k, so
    # LoLA (unlike softmax attention) is not invariant to a shift of all positions.
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        batch = model(ids, attention_mask=mask, position_ids=positions, cache=LoLACache(model)).logits
        for row in range(ids.shape[0]):
            keep = mask[row].bool()
            alone = model(ids[row : row + 1, keep], cache=LoLACache(model)).logits
            assert_rel_close(alone[0], batch[row, keep], 1e-4)


def test_stateless_forward_without_cache():
    model = apply_lola(tiny("llama"), SMALL)
    ids, mask = left_padded()
    with torch.no_grad():
        a = model(ids, attention_mask=mask, use_cache=False).logits
        b = model(ids, attention_mask=mask, cache=LoLACache(model)).logits
    assert_rel_close(real(b, mask), real(a, mask), 1e-5)


def test_remove_lola_restores_stock_model():
    model = tiny("llama")
    ids, _ = left_padded()
    with torch.no_grad():
        ref = model(ids).logits
        apply_lola(model, SMALL)
        changed = model(ids).logits
        remove_lola(model)
        again = model(ids).logits
    assert not torch.allclose(changed, ref, atol=1e-4)
    torch.testing.assert_close(again, ref)
    assert not any("lola" in k for k in model.state_dict())


def test_parameters_are_trainable_and_saved():
    model = apply_lola(tiny("llama"), lola.LoLAConfig(feature_map="hedgehog", window=4, sparse_size=4, chunk=4, mixing="lolcats"))
    keys = [k for k in model.state_dict() if ".lola." in k]
    assert any(k.endswith("self_attn.lola.feature_map_q.mlp.layer") for k in keys)
    assert any(k.endswith("self_attn.lola.window_factors") for k in keys)
    ids, _ = left_padded(batch=1, length=20)
    model(ids, labels=ids).loss.backward()
    grads = [p.grad for n, p in model.named_parameters() if ".lola." in n]
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)


def test_per_layer_overrides_and_full_attention_layers():
    cfg = lola.LoLAConfig(window=6, sparse_size=5, sinks=2, chunk=4, layer_overrides={1: {"window": 9}}, full_attention_layers=[2])
    model = apply_lola(tiny("llama", layers=3), cfg)
    mods = [layer.self_attn for layer in model.model.layers]
    assert mods[0].lola.new_state().window.size == 6 and mods[1].lola.new_state().window.size == 9
    assert not hasattr(mods[2], "lola")
    ids, mask = left_padded(length=30)
    with torch.no_grad():
        cache = LoLACache(model)
        whole = model(ids, attention_mask=mask, cache=cache).logits
        stepwise = LoLACache(model)
        parts = [model(ids[:, :20], attention_mask=mask[:, :20], cache=stepwise).logits]
        parts += [model(ids[:, t : t + 1], attention_mask=mask[:, : t + 1], cache=stepwise).logits for t in range(20, 30)]
    assert_rel_close(real(whole, mask), real(torch.cat(parts, 1), mask), 1e-4)
    assert cache.layers[2].keys.shape[2] == 30  # the full-attention layer keeps every token


@pytest.mark.parametrize(
    "cfg, match",
    [
        (lola.LoLAConfig(full_attention_layers=[5]), "full_attention_layers"),
        (lola.LoLAConfig(layer_overrides={7: {"window": 3}}), "layer_overrides"),
    ],
)
def test_bad_layer_indices(cfg, match):
    with pytest.raises(ValueError, match=match):
        apply_lola(tiny("llama"), cfg)


def test_errors():
    model = apply_lola(tiny("llama"), SMALL)
    with pytest.raises(ValueError, match="already applied"):
        apply_lola(model, SMALL)
    with pytest.raises(ValueError, match="apply_lola"):
        LoLACache(tiny("llama"))
    with pytest.raises(TypeError, match="LoLAConfig"):
        apply_lola(tiny("llama"), {"window": 3})


def _masks_seen(model, monkeypatch):
    """The 4-D masks the model's attention function receives, as a list filled by forwards."""
    import lola.integrations.transformers.attention as attention

    seen, read = [], attention.segment_padding_mask

    def spy(mask, q_len):
        seen.append(mask)
        return read(mask, q_len)

    monkeypatch.setattr(attention, "segment_padding_mask", spy)
    return seen


@pytest.mark.parametrize("full_layers", [[], [1]])
def test_a_lola_only_model_gets_its_padding_as_a_view_not_a_whole_mask(monkeypatch, full_layers):
    # Four rows of 64K tokens would build 16 GiB of bools; LoLA layers read only the diagonal.
    model = apply_lola(tiny("llama"), SMALL.model_copy(update={"full_attention_layers": full_layers}))
    ids, mask = left_padded(length=45)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    seen = _masks_seen(model, monkeypatch)
    with torch.no_grad():
        batch = model(ids, attention_mask=mask, position_ids=positions, cache=LoLACache(model)).logits
    whole = [m for m in seen if m.stride(2) != 0]
    assert (not whole) if not full_layers else whole  # a full-attention layer needs the causal mask
    for row in range(ids.shape[0]):
        keep = mask[row].bool()
        with torch.no_grad():
            alone = model(ids[row : row + 1, keep], cache=LoLACache(model)).logits
        assert_rel_close(alone[0], batch[row, keep], 1e-4)
    remove_lola(model)
    from lola.integrations.transformers.attention import _PADDING_ONLY

    assert id(model.config) not in _PADDING_ONLY
