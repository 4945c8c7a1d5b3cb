"""LoRA weights without peft at inference: merging equals peft's adapted forward, restoring is exact."""

import pytest
import torch
from peft import LoraConfig, get_peft_model_state_dict, inject_adapter_in_model

from lola.linearize import LoraSpec, merge_lora, restore_weights
from lola.models import tiny_random


def adapted(seed=0, rank=4, alpha=8.0):
    model, _ = tiny_random()
    inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=alpha, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], lora_dropout=0.0), model)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:  # peft initialises B to zero: make the adapters do something
                p.normal_(0, 0.2)
    return model


def test_merged_weights_compute_what_peft_computes():
    peft_model = adapted()
    ids = torch.randint(1, 256, (2, 40))
    with torch.no_grad():
        expected = peft_model(ids).logits
    tensors = get_peft_model_state_dict(peft_model)
    model, _ = tiny_random()
    with torch.no_grad():
        stock = model(ids).logits
    before = {k: v.clone() for k, v in model.state_dict().items()}
    originals = merge_lora(model, tensors, LoraSpec(rank=4, alpha=8.0))
    assert len(originals) == 2 * 4  # q, k, v, o of two layers
    with torch.no_grad():
        merged = model(ids).logits
    torch.testing.assert_close(merged, expected, rtol=1e-4, atol=1e-5)
    assert (merged - stock).abs().max() > 1e-3  # the adapters changed the model
    restore_weights(model, originals)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_bad_lora_tensors_are_refused():
    tensors = get_peft_model_state_dict(adapted())
    model, _ = tiny_random()
    with pytest.raises(ValueError, match="do not fit"):
        merge_lora(model, tensors, LoraSpec(rank=8, alpha=8.0))
    lone = {k: v for k, v in tensors.items() if "lora_B" not in k}
    with pytest.raises(ValueError, match="lack lora_B"):
        merge_lora(model, lone, LoraSpec(rank=4, alpha=8.0))
    with pytest.raises(ValueError, match="is not a LoRA tensor"):
        merge_lora(model, {"model.layers.0.mlp.up_proj.lora_A.weight": torch.zeros(4, 64)}, LoraSpec(rank=4))
    foreign = {k.replace("layers.1.", "layers.7."): v for k, v in tensors.items()}
    with pytest.raises(ValueError, match="does not have"):
        merge_lora(model, foreign, LoraSpec(rank=4, alpha=8.0))
    assert all(torch.equal(a, b) for a, b in zip(tiny_random()[0].state_dict().values(), model.state_dict().values()))  # nothing half-merged
