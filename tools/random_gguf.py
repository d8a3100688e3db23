"""Write a GGUF file of a preset's shapes (`webtensor.models.registry.presets`) in one of llama.cpp's mixes (Q4_K_M by
default; `--mix` q5_k_m, q3_k_m, q2_k, iq4_nl, iq4_xs) as random blocks, directly: no float checkpoint is made
and no llama-quantize is needed, so an 8B-shaped file of all 32 layers (~4.9 GB) is written in seconds. Speed and
memory do not depend on the values; the blocks have sane scales (weights of magnitude ~0.01-0.05, as trained ones),
so activations stay finite through every layer.

The mix is llama.cpp's choice of type per tensor (`formats.gguf_writer.mix_type`; Q4_K_M: Q4_K matrices and token
embedding, Q6_K for the output head and, in the layers llama.cpp gives more bits, for attn_v and ffn_down), with its
fallbacks where rows are not whole 256-value blocks; the blocks are `quant.random_weight`'s under the float16 scales
of `quant.weight.MODEL_LOG2_SCALE`; norms F32. The vocabulary is a byte-level BPE of the preset's size
(tools/random_checkpoint.py's), so the server can encode and decode text.

    python tools/random_gguf.py OUT.gguf [--preset llama-3.1-8b] [--mix q4_k_m] [--n-layer N] [--seed 0]
        [--set key=value ...]

`--set` overrides config.json keys (a small model for a local trial: --set hidden_size=256 intermediate_size=512
vocab_size=4096 num_attention_heads=4 num_key_value_heads=2 head_dim=64).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    import gguf
    import numpy as np

    sys.path.insert(0, str(Path(__file__).parent))
    from random_checkpoint import write_tokenizer

    from webtensor import quant
    from webtensor.formats.gguf_writer import KQUANT_FALLBACK, MIXES, _add_tokenizer, add_value, mix_type
    from webtensor.models import registry
    from webtensor.quant.weight import MODEL_LOG2_SCALE, random_weight
    from webtensor.text.tokenizer import Tokenizer

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--preset", default="llama-3.1-8b")
    p.add_argument("--mix", default="q4_k_m", help=f"llama.cpp's mix: {', '.join(MIXES)}")
    p.add_argument("--n-layer", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config.json keys to override")
    a = p.parse_args()
    if a.mix not in MIXES:
        p.error(f"--mix {a.mix!r}: not one of {', '.join(MIXES)}")
    t0 = time.perf_counter()
    found = registry.preset(a.preset)
    if found is None:
        p.error(f"--preset {a.preset!r}: not one of {', '.join(registry.presets())}")
    family, _, raw = found
    raw = dict(raw)
    for kv in a.set:
        key, _, value = kv.partition("=")
        raw[key] = json.loads(value)
    if a.n_layer:
        raw["num_hidden_layers"] = a.n_layer
    eos = raw["vocab_size"] - 1  # (the tokenizer's <|endoftext|>)
    raw.update(bos_token_id=eos, eos_token_id=eos)
    cfg = family.config_from_hf(raw, "config")
    spec = cfg.spec
    with tempfile.TemporaryDirectory() as td:
        write_tokenizer(Path(td), spec.vocab_size)
        tok = Tokenizer.from_dir(td)
    rng = np.random.default_rng(a.seed)
    w = gguf.GGUFWriter(str(a.out), spec.architecture)
    w.add_name(f"random-{a.preset}")
    w.add_file_type(MIXES[a.mix][1])  # llama.cpp's LLAMA_FTYPE_MOSTLY_*
    for key, value in family.gguf_metadata(cfg).items():
        add_value(w, key, value)
    _add_tokenizer(w, tok, spec.vocab_size, frozenset([eos]), eos)
    names = family.gguf_names(cfg)
    tied = "output.weight" not in names.values()  # (then llama.cpp gives the token embedding Q6_K)
    n_bytes = 0
    for name, ts in family.tensors(cfg).items():
        gname = names[name]
        if ts.kind == "float32" or len(ts.shape) == 1:
            w.add_tensor(gname, np.ones(ts.shape, np.float32) if name.endswith("weight") else
                         np.zeros(ts.shape, np.float32))
            continue
        rows, cols = ts.shape  # (N, K) in GGUF's order: rows of K values
        qtype = mix_type(a.mix, gname, spec.n_layer, tied, spec.n_head // spec.n_kv_head)
        qtype = qtype if cols % 256 == 0 else KQUANT_FALLBACK.get(qtype, qtype)
        if cols % quant.TYPES[qtype].values:
            raise SystemExit(f"{name}: rows of {cols} values are not whole {qtype} blocks")
        data = random_weight(qtype, (rows, cols), rng, MODEL_LOG2_SCALE[qtype]).blocks
        n_bytes += data.nbytes
        w.add_tensor(gname, data, raw_shape=data.shape, raw_dtype=gguf.GGMLQuantizationType[qtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {a.out}: {a.preset}, {spec.n_layer} layers, {a.mix} of random blocks, {n_bytes / 1e9:.2f} GB of "
          f"quantized weights, in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
