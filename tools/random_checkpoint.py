"""Write a checkpoint directory with random weights of any preset's shape (`webtensor.models.registry.presets`:
GPT-2's sizes, SmolLM2, Qwen2.5, Qwen3, Llama 3.2), in Hugging Face's layout, for machines without a real one (the
H200 image has none in its cache): config.json (the preset's), model.safetensors (float32 or float16, the
weights `loader.random_arrays` makes: matrices N(0, 0.02), norms 1, biases 0) and a byte-level BPE tokenizer.json
of the preset's full vocabulary (256 byte tokens, then made-up merges, then <|endoftext|> last), so every id the
model can emit decodes. `webtensor serve`, `webtensor bench` (and its `--llama-bench`, through the GGUF it writes)
and HF transformers all load it.

    python tools/random_checkpoint.py DIR [--preset gpt2] [--seed 0] [--n-layer N] [--dtype float16]
        [--set KEY=JSON ...] [--gguf FILE.gguf --gguf-type q4_1 --gguf-embedding-type q8_0
        --gguf-tensor-type PATTERN=TYPE ...]

`--gguf-type q4_k_m` (or q5_k_m, q3_k_m, q2_k, iq4_nl, iq4_xs) writes that llama.cpp mix
(`formats.gguf_writer.mix_type`) with random K-quant / IQ4 blocks
(`random_kquant_blocks`: random quants and scales under float16 super-scales of either sign, values of about
N(0, 0.03); the Q5_0 / Q8_0 fallbacks of rows that are not whole 256-blocks quantized from the random floats):
valid weights of the published shapes that webtensor, transformers and llama.cpp all read, for benchmarks (webtensor
has no K-quant quantizer; the speed does not depend on the values).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def write_tokenizer(d: Path, vocab_size: int) -> None:
    """A byte-level BPE tokenizer of exactly `vocab_size` ids: the 256 byte symbols, vocab_size - 257 merges (two
    byte symbols, then a pair and a byte symbol: up to 256 + 256^2 + 256^3 ids, in a fixed order), and
    <|endoftext|> as the last id."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    n_merges = vocab_size - len(alphabet) - 1
    if n_merges < 0:
        raise SystemExit(f"vocab_size {vocab_size} must be at least {len(alphabet) + 1}")
    vocab = {s: i for i, s in enumerate(alphabet)}
    merges: list[tuple[str, str]] = []
    level = alphabet
    while len(merges) < n_merges:
        nxt = []
        for a in level:
            for b in alphabet:
                if len(merges) == n_merges:
                    break
                merges.append((a, b))
                vocab[a + b] = len(vocab)
                nxt.append(a + b)
        level = nxt
    vocab["<|endoftext|>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(d / "tokenizer.json"))


def random_kquant_blocks(seed: int):  # -> Callable[[str, int, int], np.ndarray]
    """kquant_blocks for write_gguf: (ggml type, N, K) -> `quant.random_weight`'s blocks (N, K / 256 * block
    bytes), float16 super-scales of +-2^-13 (Q4_K's d and dmin) or +-2^-14 (Q6_K's d under random int8 scales):
    values of about N(0, 0.03)."""
    import numpy as np

    from webtensor.quant.weight import MODEL_LOG2_SCALE, random_weight

    rng = np.random.default_rng(seed + 1)
    return lambda qtype, n, k: random_weight(qtype, (n, k), rng, MODEL_LOG2_SCALE[qtype]).blocks


def main() -> None:
    import numpy as np
    from safetensors.numpy import save_file

    from webtensor.models import loader, registry

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", type=Path)
    p.add_argument("--preset", default="gpt2", help=f"one of {', '.join(registry.presets())} (default gpt2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-layer", type=int, default=None, help="fewer layers than the preset (a quick trial)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                   help="a config.json key of the preset changed (a smaller trial: --set hidden_size=256)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16"], help="the stored weights' type")
    p.add_argument("--gguf", type=Path, default=None, help="also write the checkpoint as this GGUF file")
    p.add_argument("--gguf-type", default="q8_0",
                   help="its matrices' type: f32, f16, q8_0, q4_0, q4_1, or a llama.cpp mix: q4_k_m, q5_k_m, q3_k_m, "
                        "q2_k, iq4_nl, iq4_xs (random K-quant / IQ4 blocks; default q8_0)")
    p.add_argument("--gguf-embedding-type", default=None,
                   help="its embedding's type (default: --gguf-type; SmolLM2's published Q4_1 file: q8_0)")
    p.add_argument("--gguf-tensor-type", action="append", default=[], metavar="PATTERN=TYPE",
                   help="a ggml type for the matrices whose GGUF name PATTERN (a regular expression) is found in, as "
                        "llama-quantize's --tensor-type (e.g. attn_v=q6_k; random blocks for K-quant / IQ4 types)")
    a = p.parse_args()
    found = registry.preset(a.preset)
    if found is None:
        p.error(f"--preset {a.preset!r}: not one of {', '.join(registry.presets())}")
    family, _, config = found
    for item in a.set:
        key, eq, value = item.partition("=")
        if not eq:
            p.error(f"--set {item!r}: expected KEY=JSON")
        config[key] = json.loads(value)
    eos = config["vocab_size"] - 1  # (the tokenizer's <|endoftext|>)
    config = dict(config, bos_token_id=eos, eos_token_id=eos)
    if a.n_layer:
        config["n_layer" if "n_layer" in config else "num_hidden_layers"] = a.n_layer
    cfg = family.config_from_hf(config, "config.json")
    a.dir.mkdir(parents=True, exist_ok=True)
    (a.dir / "config.json").write_text(json.dumps(config, indent=2))
    arrays = loader.random_arrays(family, cfg, a.seed)
    prefix = "transformer." if family.name == "gpt2" else "model."  # (HF's module names; lm_head has none)
    save_file({(k if k == "lm_head.weight" else prefix + k): np.ascontiguousarray(v, a.dtype)
               for k, v in arrays.items()}, str(a.dir / "model.safetensors"), metadata={"format": "pt"})
    write_tokenizer(a.dir, cfg.spec.vocab_size)
    print(f"wrote {a.dir}: {a.preset}{f' ({a.n_layer} layers)' if a.n_layer else ''}, random weights "
          f"(seed {a.seed}, {a.dtype}), {sum(v.size for v in arrays.values()):,} parameters")
    if a.gguf is not None:
        from webtensor.formats.gguf_writer import write_gguf

        types = dict(item.rpartition("=")[::2] for item in a.gguf_tensor_type)
        write_gguf(a.dir, a.gguf, a.gguf_type, a.gguf_embedding_type, kquant_blocks=random_kquant_blocks(a.seed),
                   tensor_types=types)
        print(f"wrote {a.gguf}: {a.gguf_type} matrices, {a.gguf_embedding_type or a.gguf_type} embedding")


if __name__ == "__main__":
    main()
