import pytest
import torch

transformers = pytest.importorskip("transformers")

VOCAB = 101


def tiny(arch: str = "llama", layers: int = 2, **overrides):
    """A tiny randomly initialised decoder (fp32, eval mode, SDPA attention)."""
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        attn_implementation="sdpa",
    )
    common.update(overrides)
    torch.manual_seed(0)
    if arch == "llama":
        return LlamaForCausalLM(LlamaConfig(**common)).eval()
    if arch == "mistral":
        return MistralForCausalLM(MistralConfig(sliding_window=None, **common)).eval()
    if arch == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(use_sliding_window=False, **common)).eval()
    raise ValueError(arch)


def left_padded(batch: int = 3, length: int = 40, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    for row in range(1, batch):
        mask[row, : 5 * row + 3] = 0
    return ids, mask


@pytest.fixture(scope="session")
def stage2(tmp_path_factory):
    """A tiny linearized model's folder: trained feature maps and window factors, and LoRA adapters
    (for ``lola.models.tiny_random``)."""
    from lola.linearize import FinetuneConfig, LinearizeConfig, finetune, linearize
    from lola.models import tiny_random

    out = tmp_path_factory.mktemp("maps")
    model, tok = tiny_random()
    quiet = dict(progress=False, log=lambda s: None)
    linearize(model, tok, LinearizeConfig(steps=2, chunk_tokens=64, train_chunks=1, eval_chunks=1, window=8, text=["pydoc"]), out, **quiet)
    finetune(model, tok, FinetuneConfig(steps=2, seq_len=64, eval_chunks=1, warmup_steps=0, lr=3e-2, text=["pydoc"]), out, **quiet)
    return out
