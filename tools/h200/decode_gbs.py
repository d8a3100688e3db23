"""Decode as bandwidth: the weight bytes a decode step reads (every matrix of a GGUF file, the LM head, the token
embedding only where the head is tied to it: one row of it is all a step gathers otherwise) over the time a token
takes, per engine of `webtensor bench` reports on that file (webtensor, llama.cpp's llama-bench, ...).

    python tools/h200/decode_gbs.py MODEL.gguf REPORT.json [REPORT.json ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def step_bytes(gguf_path: str) -> int:
    """Bytes of the tensors a decode step reads whole."""
    import gguf

    tensors = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(gguf_path).tensors}
    tied = "output.weight" not in tensors
    return sum(n for name, n in tensors.items() if name != "token_embd.weight" or tied)


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    nbytes = step_bytes(sys.argv[1])
    print(f"{Path(sys.argv[1]).name}: {nbytes / 1e9:.3f} GB read a decode step")
    for p in sys.argv[2:]:
        rep = json.loads(Path(p).read_text())
        for r in rep["results"]:
            tok_s = r.get("decode_tok_s")
            if tok_s:
                print(f"  {Path(p).stem:<28} {r['engine']:<12} {tok_s:>9,.1f} tok/s {1e3 / tok_s:>7.3f} ms/token "
                      f"{nbytes * tok_s / 1e9:>7,.0f} GB/s")


if __name__ == "__main__":
    main()
