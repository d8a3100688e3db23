"""Write a GGUF file's model as a Hugging Face checkpoint directory, through transformers' own GGUF reader
(`from_pretrained(dir, gguf_file=...)`: quantized tensors dequantized, llama.cpp's Q/K row order undone) and its
`save_pretrained` (config.json, model.safetensors, generation_config.json, the tokenizer files): the same weights
as float32 or float16 safetensors, for runs that compare a GGUF file's quantized weights with their float form.

    python tools/hf_from_gguf.py FILE.gguf OUT_DIR [--dtype float32|float16]
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main() -> None:
    import torch
    import transformers

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("gguf", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    a = p.parse_args()
    src = a.gguf.resolve()
    dtype = getattr(torch, a.dtype)
    read = transformers.AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=dtype)
    tok = transformers.AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    # (transformers marks a model read from GGUF as quantized and will not save it: the same weights in a plain one)
    config = read.config
    config.__dict__.pop("quantization_config", None)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.load_state_dict(read.state_dict())
    model.generation_config = read.generation_config
    model.save_pretrained(a.out)
    tok.save_pretrained(a.out)
    print(f"wrote {a.out}: {type(model).__name__} in {a.dtype} from {src.name}")


if __name__ == "__main__":
    main()
