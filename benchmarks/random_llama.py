"""A Llama-family folder of random weights in a real model's shape, with a byte-level tokenizer,
built offline: for speed and memory measurements where the weights do not matter (greedy
decoding with ``ignore_eos`` does the same work whatever they are) and no model can be fetched.

    python benchmarks/random_llama.py FOLDER [--shape smollm2|llama1b|llama8b] [--dtype bfloat16]

Shapes: ``smollm2`` (SmolLM2-135M: 30 layers, 9 heads, 3 K/V heads, head dim 64), ``llama1b``
(Llama-3.2-1B: 16 layers, 32/8 heads, head dim 64), ``llama8b`` (Llama-3.1-8B: 32 layers,
32/8 heads, head dim 128; 16 GB in bfloat16). The vocabulary is 259 byte-level symbols, so a
text of n bytes is about n tokens.
"""

from __future__ import annotations

import argparse

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SHAPES = {
    "smollm2": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3),
    "llama1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8),
    "llama8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="folder to write")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="bfloat16")
    parser.add_argument("--max-len", type=int, default=16384, help="max_position_embeddings")
    args = parser.parse_args()
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>").save_pretrained(args.out)
    cfg = LlamaConfig(
        vocab_size=len(vocab),
        max_position_embeddings=args.max_len,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
        **SHAPES[args.shape],
    )
    torch.manual_seed(0)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    model = model.to_empty(device="cpu").to(getattr(torch, args.dtype))
    for name, p in model.named_parameters():  # norms at one, the rest small: finite activations throughout
        torch.nn.init.ones_(p) if "norm" in name else torch.nn.init.normal_(p, std=0.02)
    model.save_pretrained(args.out)
    print(f"saved {args.out}: {args.shape} shape, {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M random parameters")


if __name__ == "__main__":
    main()
