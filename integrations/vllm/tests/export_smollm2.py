"""Write SmolLM2-135M-Instruct (lola's registered model, dequantised from its GGUF) as a Hugging
Face folder vLLM can load: `python export_smollm2.py FOLDER` (in lola's environment)."""

import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM

import lola


def main(folder: str) -> None:
    gguf, tok = lola.models.load("smollm2-135m-instruct")
    # transformers refuses to save a GGUF-loaded model: copy the dequantised weights into a plain one
    config = gguf.config.to_dict()
    config.pop("quantization_config", None)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config), dtype=torch.float32)
    model.load_state_dict(gguf.state_dict())
    model.to(torch.bfloat16).save_pretrained(folder)  # both sides compute in float32 from these weights
    tok.save_pretrained(folder)


if __name__ == "__main__":
    main(sys.argv[1])
