import pytest
import torch

import lola
from lola.integrations.transformers import LoLACache, apply_lola, load_lolcats_checkpoint
from tests.integrations.transformers.conftest import left_padded, tiny

CFG = lola.LoLAConfig(feature_map="hedgehog", feature_dim=8, window=6, sparse_size=4, sinks=2, chunk=4)
H, D, F = 4, 8, 8  # tiny(): hidden 32, 4 heads -> head_dim 8


def lolcats_state(layers=2, prefix="base_model.model.model.", bias=False, seed=0):
    """A synthetic checkpoint with the exact LoLCATs key names and shapes."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for i in range(layers):
        for side in "qk":
            sd[f"{prefix}layers.{i}.self_attn.feature_map_{side}.mlp.layer"] = torch.randn(H, D, F, generator=g)
            if bias:
                sd[f"{prefix}layers.{i}.self_attn.feature_map_{side}.mlp.bias"] = torch.randn(1, H, 1, 1, generator=g)
        sd[f"{prefix}layers.{i}.self_attn.window_factors"] = torch.randn(1, H, 1, 1, generator=g)
        sd[f"{prefix}layers.{i}.self_attn.q_proj.lora_A.weight"] = torch.zeros(8, 32)  # ignored
    return sd


@pytest.mark.parametrize("fmt", ["pt", "safetensors", "dict"])
def test_loads_feature_maps_and_window_factors(tmp_path, fmt):
    model = apply_lola(tiny("llama"), CFG)
    sd = lolcats_state()
    if fmt == "pt":
        src = tmp_path / "ckpt.pt"
        torch.save(sd, src)
    elif fmt == "safetensors":
        from safetensors.torch import save_file

        src = tmp_path / "ckpt.safetensors"
        save_file(sd, str(src))
    else:
        src = sd
    assert load_lolcats_checkpoint(model, src) == [0, 1]
    attn = model.model.layers[1].self_attn.lola
    torch.testing.assert_close(attn.feature_map_k.mlp.layer, sd["base_model.model.model.layers.1.self_attn.feature_map_k.mlp.layer"])
    torch.testing.assert_close(attn.window_factors, sd["base_model.model.model.layers.1.self_attn.window_factors"])
    ids, mask = left_padded()
    with torch.no_grad():
        assert torch.isfinite(model(ids, attention_mask=mask, cache=LoLACache(model)).logits).all()


def test_bias_is_loaded_and_used():
    model = apply_lola(tiny("llama"), CFG)
    sd = lolcats_state(prefix="model.", bias=True)
    load_lolcats_checkpoint(model, sd)
    fmap = model.model.layers[0].self_attn.lola.feature_map_q
    x = torch.randn(1, H, 3, D)
    z = torch.einsum("bhnd,hdf->bhnf", x, sd["model.layers.0.self_attn.feature_map_q.mlp.layer"]) + sd["model.layers.0.self_attn.feature_map_q.mlp.bias"]
    torch.testing.assert_close(fmap(x), torch.cat([z.softmax(-1), (-z).softmax(-1)], -1))


def test_mismatches_are_clear_errors():
    with pytest.raises(ValueError, match="feature_map='hedgehog', feature_dim=8"):
        load_lolcats_checkpoint(apply_lola(tiny("llama"), CFG.model_copy(update={"feature_dim": 4})), lolcats_state())
    with pytest.raises(ValueError, match="not a LoLA layer"):
        load_lolcats_checkpoint(apply_lola(tiny("llama"), CFG.model_copy(update={"full_attention_layers": [1]})), lolcats_state())
    sd = lolcats_state()
    del sd["base_model.model.model.layers.0.self_attn.window_factors"]
    with pytest.raises(ValueError, match="lacks"):
        load_lolcats_checkpoint(apply_lola(tiny("llama"), CFG), sd)
    with pytest.raises(ValueError, match="no LoLCATs keys"):
        load_lolcats_checkpoint(apply_lola(tiny("llama"), CFG), {"x": torch.zeros(1)})
    with pytest.raises(ValueError, match="apply_lola"):
        load_lolcats_checkpoint(tiny("llama"), lolcats_state())
