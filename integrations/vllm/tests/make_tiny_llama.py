"""A tiny random Llama (2 layers, head_dim 32) with a byte-level tokenizer, built offline:
`python make_tiny_llama.py FOLDER`."""

import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

out = sys.argv[1]
# byte-level vocab: 256 byte symbols + <s>, </s>
bl = pre_tokenizers.ByteLevel(add_prefix_space=False)
alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
for ch in alphabet:
    vocab[ch] = len(vocab)
tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
tok.pre_tokenizer = bl
tok.decoder = decoders.ByteLevel()
fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
fast.save_pretrained(out)
cfg = LlamaConfig(
    vocab_size=len(vocab),
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    tie_word_embeddings=False,
)
torch.manual_seed(0)
model = LlamaForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(out)
print("saved", out, len(vocab), fast("hello world").input_ids)
