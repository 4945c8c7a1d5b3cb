"""The tiny Llama exported by lola with the ``lolcats`` case's config and LoLA parameters that
differ from head to head (seeded noise on the feature maps and window factors), as a trained
model's would: `python make_tiny_trained.py TINY_FOLDER OUT_FOLDER` (in lola's environment)."""

import sys

import torch
from cases import CONFIGS
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from lola import LoLAConfig
from lola.integrations.transformers.export import export_pretrained


def main(tiny: str, out: str) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    export_pretrained(model, AutoTokenizer.from_pretrained(tiny), out, LoLAConfig(**CONFIGS["lolcats"]), vllm=True)
    g = torch.Generator().manual_seed(0)
    path = f"{out}/model.safetensors"
    tensors = load_file(path)
    for name in sorted(tensors):
        if ".lola." in name:
            tensors[name] = tensors[name] + 0.3 * torch.randn(tensors[name].shape, generator=g)
    save_file(tensors, path, metadata={"format": "pt"})


if __name__ == "__main__":
    main(*sys.argv[1:])
