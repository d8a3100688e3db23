"""Every byte-level BPE family, from a checkpoint directory and from GGUF metadata, on both paths (the
page's pure-Python BPE and `tokenizers`), against transformers on the same files.

The tokenizers are small random ones that `tokenizers` trains on the corpus with each family's own
pipeline (GPT-2; Llama 3: its split regex, ignore_merges, a BOS template; Qwen2: NFC, its regex, plain
added tokens; SmolLM2: single digits), written as the family ships them (tokenizer.json +
tokenizer_config.json) and as llama.cpp's converter writes them into a GGUF file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytestmark = pytest.mark.hf  # against transformers (the parity tier)

from gguf_fixtures import write_gguf_metadata  # noqa: E402
from text_fixtures import (  # noqa: E402
    Family,
    corpus,
    families,
    gguf_tokenizer_metadata,
    write_family_tokenizer,
)

from webtensor.errors import CheckpointError, TokenizerError  # noqa: E402
from webtensor.text.tokenizer import GPT2Tokenizer, Tokenizer  # noqa: E402

TEXTS = corpus()
FAMILIES = families()
# Which transformers reading a GGUF tokenizer must equal: transformers' GGUF reader gives llama.cpp's
# meaning of "gpt-2" and "qwen2" (neither applies Qwen's NFC: a GGUF file carries no normalizer), but
# leaves out llama-bpe's ignore_merges and smollm's digit split (it maps neither), which llama.cpp and
# the tokenizer.json the file was converted from apply: there the reference is transformers on that
# tokenizer.json.
GGUF_REFERENCE = {"gpt2": "gguf", "qwen2": "gguf", "llama3": "dir", "smollm": "dir"}


class Case:
    """One family's files and readers: ours on both paths, transformers' on the directory and the GGUF."""

    def __init__(self, root: Path, fam: Family):
        from transformers import AutoTokenizer

        self.fam = fam
        self.dir = write_family_tokenizer(root, fam)
        self.meta = gguf_tokenizer_metadata(self.dir, fam)
        self.gguf = write_gguf_metadata(root / f"{fam.name}.gguf", self.meta)
        self.hf = AutoTokenizer.from_pretrained(str(self.dir))
        self.hf_gguf = AutoTokenizer.from_pretrained(str(root), gguf_file=self.gguf.name)
        self.ours = {native: Tokenizer.from_dir(self.dir, native=native) for native in (False, True)}
        self.ours_gguf = {native: Tokenizer.from_gguf_metadata(self.meta, str(self.gguf), native=native)
                          for native in (False, True)}


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Case]:
    root = tmp_path_factory.mktemp("families")
    return {name: Case(root, fam) for name, fam in FAMILIES.items()}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_checkpoint_dir_ids_and_text_equal_transformers(cases: dict[str, Case], family: str) -> None:
    c = cases[family]
    assert {t.kind for t in c.ours.values()} == {"pure-python", "tokenizers"}
    for text in TEXTS:
        plain = c.hf(text, add_special_tokens=False)["input_ids"]
        wrapped = c.hf(text)["input_ids"]
        for tok in c.ours.values():
            assert tok.encode(text) == plain, (tok.kind, text)
            assert tok.encode(text, add_special_tokens=True) == wrapped, (tok.kind, text)
            for skip in (True, False):
                assert tok.decode(plain, skip_special_tokens=skip) == c.hf.decode(plain, skip_special_tokens=skip)
            assert tok.decode(plain) == c.hf.decode(plain, skip_special_tokens=True)
            assert "".join(tok.stream_decode(plain)) == tok.decode(plain)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_named_tokens_equal_transformers(cases: dict[str, Case], family: str) -> None:
    c = cases[family]
    for tok in [*c.ours.values(), *c.ours_gguf.values()]:
        assert tok.bos_token_id == c.hf.bos_token_id and tok.eos_token_id == c.hf.eos_token_id, tok
        assert tok.pad_token_id == c.hf.pad_token_id, tok
        assert tok.special_tokens_map == {k: v for k, v in c.hf.special_tokens_map.items() if isinstance(v, str)}
        assert tok.vocab_size == len(c.hf), tok
        assert tok.special_ids == frozenset(c.hf.all_special_ids) | {
            i for i, t in c.hf.added_tokens_decoder.items() if t.special}
        assert tok.add_bos_token == c.fam.bos_template
    assert GPT2Tokenizer is Tokenizer


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_gguf_ids_equal_transformers(cases: dict[str, Case], family: str) -> None:
    c = cases[family]
    ref = c.hf_gguf if GGUF_REFERENCE[family] == "gguf" else c.hf
    assert {t.kind for t in c.ours_gguf.values()} == {"pure-python", "tokenizers"}
    for text in TEXTS:
        plain = ref(text, add_special_tokens=False)["input_ids"]
        for tok in c.ours_gguf.values():
            assert tok.encode(text) == plain, (tok.kind, text)
            assert tok.encode(text, add_special_tokens=True) == ref(text)["input_ids"], (tok.kind, text)
            assert tok.decode(plain) == ref.decode(plain, skip_special_tokens=True)


def test_gguf_file_reader_gives_the_same_tokenizer(cases: dict[str, Case]) -> None:
    """The metadata as the `gguf` package reads it back from the file builds the same tokenizer."""
    from gguf import GGUFReader

    for c in cases.values():
        r = GGUFReader(str(c.gguf))
        meta = {k: f.contents() for k, f in r.fields.items()}
        tok = Tokenizer.from_gguf_metadata(meta, str(c.gguf))
        assert tok.spec.vocab == c.ours_gguf[True].spec.vocab and tok.spec.pre_steps == c.ours_gguf[True].spec.pre_steps
        assert [tok.encode(t) for t in TEXTS[:8]] == [c.ours_gguf[True].encode(t) for t in TEXTS[:8]]


def test_special_tokens_never_shown_unless_asked(cases: dict[str, Case]) -> None:
    c = cases["qwen2"]
    for tok in c.ours.values():
        text = "<|im_start|>user\nHi<think>x</think><|im_end|><|endoftext|>"
        ids = tok.encode(text)
        assert tok.decode(ids) == "user\nHi<think>x</think>"  # plain added tokens (<think>) are text
        assert tok.decode(ids, skip_special_tokens=False) == text
        assert b"".join(tok.token_bytes(i) for i in ids) == b"user\nHi<think>x</think>"
        assert tok.token_bytes(tok.eos_token_id) == b"" and tok.token_bytes(tok.eos_token_id,
                                                                           skip_special_tokens=False) == b"<|im_end|>"
        assert "".join(tok.stream_decode(ids)) == "user\nHi<think>x</think>"


# -- refusals: one line naming the field ----------------------------------------------------------

GGUF_REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("sentencepiece", {"tokenizer.ggml.model": "llama"}, "tokenizer.ggml.model is 'llama' .a SentencePiece"),
    ("wordpiece", {"tokenizer.ggml.model": "bert"}, "tokenizer.ggml.model is 'bert' .a WordPiece"),
    ("no model", {"tokenizer.ggml.model": None}, "tokenizer.ggml.model is None"),
    ("unknown pre", {"tokenizer.ggml.pre": "tekken"}, "tokenizer.ggml.pre 'tekken' is not supported"),
    ("pre type", {"tokenizer.ggml.pre": 7}, "tokenizer.ggml.pre must be str"),
    ("tokens", {"tokenizer.ggml.tokens": None}, "tokenizer.ggml.tokens is missing"),
    ("merge", {"tokenizer.ggml.merges": ["a b c"]}, "tokenizer.ggml.merges: merge #0 'a b c' is not 'left right'"),
    ("merge part", {"tokenizer.ggml.merges": ["zz qq"]}, "token 'zz' is not in the vocabulary"),
    ("types", {"tokenizer.ggml.token_type": [1, 1]}, "tokenizer.ggml.token_type must be"),
    ("eos id", {"tokenizer.ggml.eos_token_id": 10**6}, "tokenizer.ggml.eos_token_id = 1000000 is outside"),
    ("bos flag", {"tokenizer.ggml.add_bos_token": "yes"}, "tokenizer.ggml.add_bos_token must be bool"),
    ("bos missing", {"tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.bos_token_id": None},
     "add_bos_token is true but tokenizer.ggml.bos_token_id is not set"),
]


@pytest.mark.parametrize(("case", "edit", "message"), GGUF_REFUSED, ids=[c[0] for c in GGUF_REFUSED])
def test_gguf_refusals_name_the_field(cases: dict[str, Case], case: str, edit: dict[str, Any], message: str) -> None:
    meta = {k: v for k, v in {**cases["smollm"].meta, **edit}.items() if v is not None}
    for native in (False, True):
        with pytest.raises(TokenizerError, match=message) as info:
            Tokenizer.from_gguf_metadata(meta, "f.gguf", native=native)
        assert "\n" not in str(info.value) and str(info.value).startswith("f.gguf: ")
        assert isinstance(info.value, CheckpointError)


def test_wordpiece_tokenizer_json_refused(tmp_path: Path, cases: dict[str, Case]) -> None:
    data = json.loads((cases["gpt2"].dir / "tokenizer.json").read_text(encoding="utf-8"))
    data["model"] = {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                     "max_input_chars_per_word": 100, "vocab": {"[UNK]": 0, "a": 1}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    for native in (False, True):
        with pytest.raises(TokenizerError, match=r"model type 'WordPiece' is not supported \(need 'BPE'"):
            Tokenizer.from_dir(tmp_path, native=native)


def test_named_token_outside_vocabulary_refused(tmp_path: Path, cases: dict[str, Case]) -> None:
    (tmp_path / "tokenizer.json").write_bytes((cases["smollm"].dir / "tokenizer.json").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|no_such|>"}), encoding="utf-8")
    with pytest.raises(TokenizerError, match=r"tokenizer_config.json: eos_token '<\|no_such\|>' is not in the vocab"):
        Tokenizer.from_dir(tmp_path)


_PAGE = """
import json, sys, unicodedata
sys.path.insert(0, "/src")
from webtensor.text.tokenizer import Tokenizer
data = json.load(open("/case/in.json"))
out = {"unicode": unicodedata.unidata_version, "dir": {}, "gguf": {}}
for name, meta in data["gguf"].items():
    toks = {"dir": Tokenizer.from_dir("/case/" + name), "gguf": Tokenizer.from_gguf_metadata(meta, name)}
    for kind, tok in toks.items():
        assert tok.kind == "pure-python", tok.kind
        out[kind][name] = [tok.encode(t, add_special_tokens=True) for t in data["texts"]]
json.dump(out, open("/case/out.json", "w"))
"""


def test_page_python_gives_native_ids(tmp_path: Path, cases: dict[str, Case]) -> None:
    """The pure-Python tokenizer inside Pyodide (the page's Python and Unicode database) gives the
    native ids for every family, from the directory and from the GGUF metadata."""
    import random
    import shutil

    from text_fixtures import FRAGMENTS, run_in_pyodide

    rng = random.Random(5)
    texts = TEXTS + ["".join(rng.choice(FRAGMENTS) for _ in range(rng.randrange(1, 9))) for _ in range(300)]
    case = tmp_path / "case"
    for name, c in cases.items():
        shutil.copytree(c.dir, case / name)
    (case / "in.json").write_text(json.dumps({"texts": texts, "gguf": {n: c.meta for n, c in cases.items()}}),
                                  encoding="utf-8")
    run_in_pyodide(_PAGE, {"/src": Path(__file__).resolve().parents[1] / "src", "/case": case}, tmp_path)
    out = json.loads((case / "out.json").read_text(encoding="utf-8"))
    for name, c in cases.items():
        for kind, native in (("dir", c.ours[True]), ("gguf", c.ours_gguf[True])):
            want = [native.encode(t, add_special_tokens=True) for t in texts]
            for text, w, got in zip(texts, want, out[kind][name], strict=True):
                assert got == w, (name, kind, out["unicode"], text)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_gguf_metadata_written_as_llama_cpp_converts(cases: dict[str, Case], family: str) -> None:
    """`gguf_tokenizer_metadata` (what a GGUF writer stores) is the metadata llama.cpp's converter writes
    for the directory, and reads back as the same tokenizer."""
    from webtensor.text.tokenizer_files import gguf_tokenizer_metadata

    c = cases[family]
    meta = gguf_tokenizer_metadata(c.ours[True].spec)
    assert {k: v for k, v in meta.items() if k in c.meta} == c.meta
    assert meta["tokenizer.ggml.add_eos_token"] is False
    back = Tokenizer.from_gguf_metadata(meta)
    assert [back.encode(t, add_special_tokens=True) for t in TEXTS] == [
        c.ours_gguf[True].encode(t, add_special_tokens=True) for t in TEXTS]
    padded = gguf_tokenizer_metadata(c.ours[True].spec, vocab_size=len(c.hf) + 3)
    assert padded["tokenizer.ggml.tokens"][-1] == f"[PAD{len(c.hf) + 2}]"
    assert padded["tokenizer.ggml.token_type"][-1] == 5  # unused
    assert Tokenizer.from_gguf_metadata(padded).vocab_size == len(c.hf) + 3


@pytest.mark.parametrize(("add_bos", "add_eos"), [(False, False), (True, False), (True, True)])
def test_vocab_merges_with_config_flags(tmp_path: Path, cases: dict[str, Case], add_bos: bool, add_eos: bool) -> None:
    """GPT-2's vocab.json + merges.txt: tokenizer_config.json's add_bos_token / add_eos_token wrap the
    text as transformers wraps it (there is no tokenizer.json post-processor to say otherwise)."""
    from tokenizers import Tokenizer as HFTokenizer
    from transformers import AutoTokenizer

    HFTokenizer.from_file(str(cases["gpt2"].dir / "tokenizer.json")).model.save(str(tmp_path))
    config = {"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
              "add_bos_token": add_bos, "add_eos_token": add_eos}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    hf = AutoTokenizer.from_pretrained(str(tmp_path))
    for native in (False, True):
        tok = Tokenizer.from_dir(tmp_path, native=native)
        assert tok.add_bos_token == add_bos
        for text in TEXTS[:12]:
            assert tok.encode(text, add_special_tokens=True) == hf(text)["input_ids"], (native, text)
            assert tok.encode(text) == hf(text, add_special_tokens=False)["input_ids"]
