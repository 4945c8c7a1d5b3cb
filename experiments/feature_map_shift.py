"""Do trained feature maps see only relative positions? Layer 0, one text, shifted RoPE positions.

Softmax logits after RoPE depend on the distance between query and key only; Hedgehog features
``φ(x) = softmax(xW)`` of the rotated vectors need not. This script takes ``--tokens`` tokens of
the model's own training split, computes layer 0's rotated queries and keys as if the text
started at each of ``--offsets`` (layer 0 reads token embeddings only: nothing upstream moves),
and prints the mean softmax logit and the mean feature kernel ``φ(q)ᵀφ(k)`` over query/key pairs
at least a chunk apart (as folded tokens are), per head, against the first offset.

    python experiments/feature_map_shift.py --feature-maps smollm2-135m-instruct --offsets 0 1536 3584 7680
"""

from __future__ import annotations

import argparse

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--feature-maps", required=True, help="a shipped name or a `lola linearize` folder")
    parser.add_argument("--offsets", type=int, nargs="+", default=[0, 1536, 3584, 7680])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--gap", type=int, default=64, help="least distance of a counted pair (a chunk)")
    args = parser.parse_args()
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    import lola
    from lola import models
    from lola.data.text import encode, load_split
    from lola.integrations.transformers import apply_lola
    from lola.pretrained.folder import read_feature_maps

    model, tok = models.load(args.model)
    apply_lola(model, lola.LoLAConfig(), feature_maps=read_feature_maps(args.feature_maps))
    train, _ = load_split()
    ids = encode(tok, train[: 50 * args.tokens])[: args.tokens][None]
    t = ids.shape[1]
    attn, maps = model.model.layers[0].self_attn, model._lola.modules[0]
    heads, kv_heads, d = maps.num_heads, maps.num_kv_heads, maps.head_dim
    pairs = torch.ones(t, t, dtype=torch.bool).tril(-args.gap)
    base = None
    with torch.no_grad():
        h = model.model.layers[0].input_layernorm(model.model.embed_tokens(ids))
        q = attn.q_proj(h).view(1, t, heads, d).transpose(1, 2)
        k = attn.k_proj(h).view(1, t, kv_heads, d).transpose(1, 2).repeat_interleave(heads // kv_heads, dim=1)
        for offset in args.offsets:
            cos, sin = model.model.rotary_emb(h, torch.arange(offset, offset + t)[None])
            qr, kr = apply_rotary_pos_emb(q, k, cos, sin)
            kernel = torch.einsum("bhif,bhjf->bhij", maps.feature_map_q(qr), maps.feature_map_k(kr))[..., pairs].mean(-1)[0]  # [H]
            logit = (torch.einsum("bhid,bhjd->bhij", qr, kr) * maps.scale)[..., pairs].mean()
            base = kernel if base is None else base
            ratio = " ".join(f"{float(r):5.2f}" for r in kernel / base)
            print(f"offset {offset:6d}: mean logit {float(logit):.4f}  mean φ(q)ᵀφ(k) {float(kernel.mean()):.4f}  per head ×first: {ratio}")


if __name__ == "__main__":
    main()
