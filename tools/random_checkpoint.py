"""Write a GPT-2 checkpoint directory with random weights, in Hugging Face's layout, for machines
without a real one (the H200 image has no GPT-2 in its cache): config.json, model.safetensors
(float32, GPT-2's N(0, 0.02) init) and a byte-level BPE tokenizer.json of the preset's full
vocabulary (256 byte tokens, then made-up merges of two of them, then <|endoftext|> last, as in
GPT-2), so every id the model can emit decodes. `webtensor serve`, `webtensor bench` and HF
transformers all load it.

    python tools/random_checkpoint.py DIR [--preset gpt2] [--seed 0] [--n-layer N]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def write_tokenizer(d: Path, vocab_size: int) -> None:
    """A byte-level BPE tokenizer of exactly `vocab_size` ids: the 256 byte symbols, vocab_size - 257
    merges of two byte symbols (in a fixed order), and <|endoftext|> as the last id."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    n_merges = vocab_size - len(alphabet) - 1
    if not 0 <= n_merges <= len(alphabet) ** 2:
        raise SystemExit(f"vocab_size {vocab_size} must be in {len(alphabet) + 1}..{len(alphabet) ** 2 + 257}")
    vocab = {s: i for i, s in enumerate(alphabet)}
    merges = [(a, b) for a in alphabet for b in alphabet][:n_merges]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(d / "tokenizer.json"))


def main() -> None:
    import numpy as np
    from safetensors.numpy import save_file

    from webtensor.models.gpt2 import GPT2Config
    from webtensor.models.loader import random_arrays

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", type=Path)
    p.add_argument("--preset", default="gpt2", help="gpt2, gpt2-medium, gpt2-large or gpt2-xl (default gpt2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-layer", type=int, default=None, help="fewer layers than the preset (a quick trial)")
    a = p.parse_args()
    cfg = GPT2Config.preset(a.preset, **({"n_layer": a.n_layer} if a.n_layer else {}))
    a.dir.mkdir(parents=True, exist_ok=True)
    eos = cfg.vocab_size - 1
    config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": cfg.vocab_size,
              "n_positions": cfg.n_positions, "n_embd": cfg.n_embd, "n_layer": cfg.n_layer, "n_head": cfg.n_head,
              "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
              "bos_token_id": eos, "eos_token_id": eos, "tie_word_embeddings": True}
    (a.dir / "config.json").write_text(json.dumps(config, indent=2))
    arrays = random_arrays("gpt2", cfg, a.seed)
    save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(a.dir / "model.safetensors"),
              metadata={"format": "pt"})
    write_tokenizer(a.dir, cfg.vocab_size)
    print(f"wrote {a.dir}: {a.preset}{f' ({cfg.n_layer} layers)' if a.n_layer else ''}, random weights "
          f"(seed {a.seed}), {sum(v.size for v in arrays.values()):,} parameters")


if __name__ == "__main__":
    main()
