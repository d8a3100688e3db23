#!/usr/bin/env python3
"""Train the tiny GPT-2 that ships inside ``webtensor`` (``src/webtensor/models/gpt2/shipped/``).

Corpus
------
Jane Austen's six completed novels (Sense and Sensibility, Pride and Prejudice, Mansfield
Park, Emma, Northanger Abbey, Persuasion), public-domain texts, as carried inside the
Debian package ``r-cran-janeaustenr`` (version 1.0.0-1 in Debian 12 "bookworm"; packaging of
the CRAN package ``janeaustenr`` 1.0.0 by Julia Silge, MIT license).  The texts sit in the
package's R lazy-load database ``/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb`` (+ ``.rdx``
index); this script decodes that database with a small pure-Python reader of R's XDR
serialization format, so R itself is never run.

The corpus is therefore NOT a pip package.  Install it (once, as root) with::

    apt-get install --no-install-recommends r-cran-janeaustenr

or, without installing R at all, fetch the .deb and point ``--corpus`` at it (the script reads
the .deb's ``data.tar.*`` member directly)::

    apt-get download r-cran-janeaustenr
    python tools/train_tiny_gpt2.py --corpus r-cran-janeaustenr_1.0.0-1_all.deb

This script installs nothing and downloads nothing.  Python requirements: torch (CPU),
transformers, tokenizers, safetensors, numpy (the project's ``test`` extra).

What it does
------------
(a) extracts the six novels, unwraps the hard-wrapped Gutenberg lines into paragraphs and
    drops chapter/volume headings and the ``_italics_`` underscores;
(b) trains a byte-level BPE tokenizer (``tokenizers``; ByteLevel pre-tokenizer/decoder/post-
    processor like GPT-2's, ``<|endoftext|>`` special token) and saves it in Hugging Face form:
    ``tokenizer.json`` plus ``vocab.json`` + ``merges.txt`` (+ ``tokenizer_config.json`` and
    ``special_tokens_map.json`` so ``GPT2TokenizerFast.from_pretrained`` works too);
(c) trains a small ``transformers.GPT2LMHeadModel`` (tied embeddings) on the CPU with AdamW and
    a linear-warmup + cosine learning-rate schedule, holding out the last ``--val-frac`` of every
    novel as the validation split;
(d) saves ``config.json`` + ``model.safetensors`` (+ ``generation_config.json``) and the
    tokenizer files into the output directory, then reloads them with ``from_pretrained`` and
    prints greedy and sampled continuations.

Reproduce the shipped model (from the repository root, ~20 minutes on one CPU core)::

    .venv/bin/python tools/train_tiny_gpt2.py --out src/webtensor/models/gpt2/shipped \
        --seed 1234 --steps 2600 --time-budget 1320 --bf16

Everything is seeded (python ``random``, numpy, torch; the tokenizer trainer is
deterministic).  The number of optimizer steps is fixed by ``--steps`` and only capped by
``--time-budget`` (if the run is projected to overshoot it, the cosine schedule is shortened so
it still ends at ``--min-lr``; the log says so), so a machine at least as fast reproduces the
same run when the budget is not hit.  The script uses ``torch.set_num_threads(1)`` unless
``--threads`` says otherwise.  The training forward pass runs under bfloat16 autocast
(``--no-bf16`` to disable); weights, optimizer state, evaluation and the saved checkpoint are
float32.  Bit-exact results also depend on the CPU's kernels (oneDNN/MKL), as always with torch.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import math
import os
import random
import re
import struct
import sys
import tarfile
import time
import zlib
from pathlib import Path

DEFAULT_RDB = Path("/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb")
CORPUS_PACKAGE = "r-cran-janeaustenr (Debian)"
NOVELS = {  # R object name -> title, in publication order
    "sensesensibility": "Sense and Sensibility",
    "prideprejudice": "Pride and Prejudice",
    "mansfieldpark": "Mansfield Park",
    "emma": "Emma",
    "northangerabbey": "Northanger Abbey",
    "persuasion": "Persuasion",
}
EOT = "<|endoftext|>"


# --------------------------------------------------------------------------------------------
# (a) corpus extraction: a minimal reader for R's XDR serialization (enough for lazy-load DBs)
# --------------------------------------------------------------------------------------------
class _RReader:
    """Decode the subset of R's serialize() format (version 2/3, XDR) used by data objects:
    NULL, symbols, pairlists, character/integer/logical/double/generic vectors, references."""

    NILVALUE, REFSXP, EMPTYENV, BASEENV, GLOBALENV, UNBOUND, MISSING, BASENS = (
        254, 255, 242, 241, 253, 252, 251, 247)

    def __init__(self, data: bytes):
        self.b = data
        self.i = 0
        self.refs: list = []
        if self.b[:2] != b"X\n":
            raise ValueError(f"not an XDR R serialization stream (header {self.b[:2]!r})")
        self.i = 2
        version = self._int()
        self._int()  # writer R version
        self._int()  # minimal reader version
        if version == 3:
            n = self._int()
            self.i += n  # native encoding name
        elif version != 2:
            raise ValueError(f"unsupported R serialization version {version}")

    def _int(self) -> int:
        (v,) = struct.unpack_from(">i", self.b, self.i)
        self.i += 4
        return v

    def _length(self) -> int:
        n = self._int()
        if n == -1:
            hi, lo = self._int(), self._int()
            n = (hi << 32) + lo
        return n

    def read(self):
        flags = self._int()
        t = flags & 0xFF
        has_attr = bool(flags & (1 << 9))
        has_tag = bool(flags & (1 << 10))
        if t in (self.NILVALUE, self.EMPTYENV, self.BASEENV, self.GLOBALENV, self.UNBOUND,
                 self.MISSING, self.BASENS):
            return None
        if t == self.REFSXP:
            idx = flags >> 8
            if idx == 0:
                idx = self._int()
            return self.refs[idx - 1]
        if t == 1:  # SYMSXP
            name = self.read()
            self.refs.append(name)
            return name
        if t in (2, 6, 17):  # LISTSXP / LANGSXP / DOTSXP: a pairlist, returned as [(tag, value)]
            out = []
            while True:
                if has_attr:
                    self.read()
                tag = self.read() if has_tag else None
                out.append((tag, self.read()))
                flags = self._int()
                t = flags & 0xFF
                if t != 2:
                    # the cdr was not a pairlist cell: it must be NULL for the lists we read
                    if t != self.NILVALUE:
                        raise ValueError(f"unsupported pairlist tail type {t}")
                    return out
                has_attr = bool(flags & (1 << 9))
                has_tag = bool(flags & (1 << 10))
        if t == 9:  # CHARSXP
            n = self._int()
            if n == -1:
                return None  # NA_character_
            s = self.b[self.i:self.i + n]
            self.i += n
            levels = flags >> 12
            enc = "latin-1" if levels & 4 else "utf-8"
            return s.decode(enc)
        if t == 16:  # STRSXP
            val = [self.read() for _ in range(self._length())]
        elif t in (10, 13):  # LGLSXP / INTSXP
            n = self._length()
            val = list(struct.unpack_from(f">{n}i", self.b, self.i))
            self.i += 4 * n
        elif t == 14:  # REALSXP
            n = self._length()
            val = list(struct.unpack_from(f">{n}d", self.b, self.i))
            self.i += 8 * n
        elif t in (19, 20):  # VECSXP / EXPRSXP
            val = [self.read() for _ in range(self._length())]
        else:
            raise ValueError(f"unsupported R SEXP type {t}")
        if has_attr:
            attrs = dict(self.read())
            names = attrs.get("names")
            if names is not None and t in (19, 20):
                val = dict(zip(names, val, strict=True))
        return val


def _r_unserialize(blob: bytes):
    return _RReader(blob).read()


def _lazyload_value(rdb: bytes, offset: int, length: int):
    """One value of an R lazy-load DB: 4-byte big-endian raw length, then a compressed blob."""
    chunk = rdb[offset:offset + length]
    (raw_len,) = struct.unpack(">I", chunk[:4])
    body = chunk[4:]
    if body[:1] == b"Z":  # xz (compression type 3)
        import lzma
        raw = lzma.decompress(body[1:])
    elif body[:1] == b"2":  # bzip2 (type 2)
        import bz2
        raw = bz2.decompress(body[1:])
    elif body[:1] == b"0":  # stored
        raw = body[1:]
    else:  # zlib (type 1, the default)
        raw = zlib.decompress(body)
    if len(raw) != raw_len:
        raise ValueError("corrupt lazy-load DB entry")
    return _r_unserialize(raw)


def _read_lazyload_db(rdx: bytes, rdb: bytes) -> dict[str, list]:
    index = _r_unserialize(gzip.decompress(rdx) if rdx[:2] == b"\x1f\x8b" else rdx)
    variables = index["variables"]
    return {name: _lazyload_value(rdb, off, ln) for name, (off, ln) in variables.items()}


def _files_from_deb(deb_path: Path, wanted: tuple[str, ...]) -> dict[str, bytes]:
    """Pull members out of a .deb (an `ar` archive holding data.tar.{xz,gz,zst})."""
    data = deb_path.read_bytes()
    if data[:8] != b"!<arch>\n":
        raise ValueError(f"{deb_path} is not a .deb (ar) archive")
    i = 8
    while i < len(data):
        name = data[i:i + 16].decode().strip().rstrip("/")
        size = int(data[i + 48:i + 58].decode().strip())
        body = data[i + 60:i + 60 + size]
        i += 60 + size + (size & 1)
        if name.startswith("data.tar"):
            if name.endswith(".zst"):
                raise ValueError("zstd-compressed .deb: extract it with `dpkg-deb -x` instead")
            with tarfile.open(fileobj=io.BytesIO(body), mode="r:*") as tar:
                out = {}
                for m in tar.getmembers():
                    for w in wanted:
                        if m.name.lstrip("./").endswith(w):
                            out[w] = tar.extractfile(m).read()
                return out
    raise ValueError(f"no data.tar member in {deb_path}")


def load_novels(corpus: Path) -> dict[str, list[str]]:
    """Return {object name: list of text lines} for the six novels."""
    if corpus.suffix == ".deb":
        files = _files_from_deb(corpus, ("janeaustenr/data/Rdata.rdx", "janeaustenr/data/Rdata.rdb"))
        rdx, rdb = files["janeaustenr/data/Rdata.rdx"], files["janeaustenr/data/Rdata.rdb"]
    else:
        if corpus.is_dir():
            corpus = corpus / "Rdata.rdb"
        rdb = corpus.read_bytes()
        rdx = corpus.with_suffix(".rdx").read_bytes()
    objs = _read_lazyload_db(rdx, rdb)
    missing = set(NOVELS) - set(objs)
    if missing:
        raise ValueError(f"corpus lacks {sorted(missing)}")
    return {k: objs[k] for k in NOVELS}


_HEADING = re.compile(
    r"^(?:(?:CHAPTER|Chapter|VOLUME|Volume)\b.*|(?:[IVXLC]+\.?)|THE END|FINIS|"
    r"(?:END OF (?:THE )?(?:FIRST|SECOND|THIRD) VOLUME\.?))$")


_FRONT_MATTER = re.compile(r"(?i)by|by jane austen|jane austen(?: \(\d{4}\))?|\(\d{4}\)|[* ]+")


def clean_novel(lines: list[str], title: str) -> list[str]:
    """Hard-wrapped lines -> list of paragraphs (title and headings removed)."""
    paras, cur = [], []
    for raw in lines + [""]:
        line = (raw or "").strip()
        if not line:
            if cur:
                paras.append(" ".join(cur))
                cur = []
            continue
        cur.append(line)
    out = []
    for p in paras:
        p = re.sub(r"\s+", " ", p).strip()
        if _HEADING.match(p) or p.upper() == title.upper() or _FRONT_MATTER.fullmatch(p):
            continue
        p = p.replace("_", "")
        out.append(p)
    return out


def build_corpus(corpus: Path) -> dict[str, str]:
    novels = load_novels(corpus)
    return {k: "\n\n".join(clean_novel(v, NOVELS[k])) for k, v in novels.items()}


# --------------------------------------------------------------------------------------------
# (b) tokenizer
# --------------------------------------------------------------------------------------------
def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def save_tokenizer(tok, out: Path, n_positions: int) -> None:
    tok.save(str(out / "tokenizer.json"))
    tok.model.save(str(out))  # vocab.json + merges.txt
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": EOT, "eos_token": EOT, "unk_token": EOT}, indent=2) + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer",
        "add_prefix_space": False,
        "bos_token": EOT,
        "eos_token": EOT,
        "unk_token": EOT,
        "model_max_length": n_positions,
        "clean_up_tokenization_spaces": False,
    }, indent=2) + "\n")


# --------------------------------------------------------------------------------------------
# (c) model training
# --------------------------------------------------------------------------------------------
def lr_at(step: int, total: int, warmup: int, peak: float, floor: float) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * t))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=DEFAULT_RDB,
                    help="janeaustenr Rdata.rdb (or its data/ dir, or the r-cran-janeaustenr .deb)")
    ap.add_argument("--out", type=Path, default=Path("src/webtensor/models/gpt2/shipped"))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=160)
    ap.add_argument("--n-positions", type=int, default=256)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2600)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr", type=float, default=1e-4)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--val-frac", type=float, default=0.04)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--eval-batches", type=int, default=24)
    ap.add_argument("--time-budget", type=float, default=1320.0,
                    help="seconds of training after which the LR schedule is compressed to end")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True,
                    help="bfloat16 autocast for the training forward pass (fp32 master weights, "
                         "optimizer, evaluation and checkpoint); ~1.6x faster on CPUs with "
                         "AVX512-BF16/AMX (default: on)")
    ap.add_argument("--bench", action="store_true", help="time a few steps and exit")
    args = ap.parse_args(argv)

    import numpy as np
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    t_start = time.time()

    # (a) corpus
    docs = build_corpus(args.corpus)
    total_chars = sum(len(d) for d in docs.values())
    print(f"corpus: {len(docs)} novels, {total_chars:,} characters", flush=True)
    train_texts, val_texts = {}, {}
    for k, d in docs.items():
        paras = d.split("\n\n")
        cut = int(len(paras) * (1.0 - args.val_frac))
        train_texts[k] = "\n\n".join(paras[:cut])
        val_texts[k] = "\n\n".join(paras[cut:])

    # (b) tokenizer, trained on the training split only (paragraph by paragraph)
    tok_paras = [p for d in train_texts.values() for p in d.split("\n\n")]
    tok = train_tokenizer(tok_paras, args.vocab_size)
    eot_id = tok.token_to_id(EOT)
    assert eot_id == 0, eot_id
    vocab = tok.get_vocab_size()
    print(f"tokenizer: vocab {vocab}, trained in {time.time() - t_start:.1f}s", flush=True)

    def encode_split(texts: dict[str, str]) -> np.ndarray:
        ids: list[int] = []
        for k in NOVELS:
            ids.extend(tok.encode(texts[k]).ids)
            ids.append(eot_id)
        return np.asarray(ids, dtype=np.int64)

    train_ids = encode_split(train_texts)
    val_ids = encode_split(val_texts)
    print(f"tokens: train {len(train_ids):,}  val {len(val_ids):,}  "
          f"({total_chars / (len(train_ids) + len(val_ids)):.2f} chars/token)", flush=True)

    # (c) model
    config = GPT2Config(
        vocab_size=vocab, n_positions=args.n_positions, n_embd=args.n_embd, n_layer=args.n_layer,
        n_head=args.n_head, n_inner=None, activation_function="gelu_new",
        resid_pdrop=args.dropout, embd_pdrop=args.dropout, attn_pdrop=args.dropout,
        layer_norm_epsilon=1e-5, initializer_range=0.02, tie_word_embeddings=True,
        bos_token_id=eot_id, eos_token_id=eot_id,
    )
    model = GPT2LMHeadModel(config)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params:,} parameters ({n_params * 4 / 1e6:.2f} MB fp32)", flush=True)

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and "wpe" not in name else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    gen = torch.Generator().manual_seed(args.seed)
    T, B = args.seq_len, args.batch_size
    train_t = torch.from_numpy(train_ids)
    val_t = torch.from_numpy(val_ids)

    def batch(data: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        ix = torch.randint(0, len(data) - T - 1, (B,), generator=g)
        return torch.stack([data[i:i + T + 1] for i in ix.tolist()])

    # fixed validation batches: non-overlapping windows spread over the whole val split
    starts = np.linspace(0, len(val_ids) - T - 2, args.eval_batches * B).astype(np.int64)
    val_batches = torch.stack([val_t[s:s + T + 1] for s in starts.tolist()]).view(
        args.eval_batches, B, T + 1)

    @torch.no_grad()
    def evaluate(split_batches) -> float:
        model.eval()
        losses = []
        for xb in split_batches:
            out = model(input_ids=xb[:, :-1])
            losses.append(torch.nn.functional.cross_entropy(
                out.logits.reshape(-1, vocab), xb[:, 1:].reshape(-1)).item())
        model.train()
        return float(np.mean(losses))

    eval_gen = torch.Generator().manual_seed(args.seed + 1)
    train_eval_batches = [batch(train_t, eval_gen) for _ in range(args.eval_batches)]

    if args.bench:
        model.train()
        for i in range(6):
            if i == 1:
                t0 = time.time()
            xb = batch(train_t, gen)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                logits = model(input_ids=xb[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab),
                                                     xb[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        dt = (time.time() - t0) / 5
        print(f"bench: {dt:.3f}s/step, {B * T / dt:,.0f} tokens/s", flush=True)
        return 0

    total_steps = args.steps
    budget_start = time.time()
    model.train()
    history = []
    best = None
    step = 0
    while step < total_steps:
        lr = lr_at(step, total_steps, args.warmup, args.lr, args.min_lr)
        for g_ in opt.param_groups:
            g_["lr"] = lr
        xb = batch(train_t, gen)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            logits = model(input_ids=xb[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab),
                                                 xb[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        elapsed = time.time() - budget_start
        if step % 25 == 0:
            print(f"step {step}/{total_steps} loss {loss.item():.4f} lr {lr:.2e} "
                  f"{elapsed:.0f}s", flush=True)
        # time guard: if the projected run overshoots the budget, shorten the schedule so the
        # cosine still decays to min_lr by the (new) last step.
        if step >= 50 and step % 25 == 0:
            projected = elapsed / step * total_steps
            if projected > args.time_budget:
                new_total = max(step + 1, int(args.time_budget / (elapsed / step)))
                if new_total < total_steps:
                    print(f"time budget: shortening schedule {total_steps} -> {new_total}", flush=True)
                    total_steps = new_total
        if step % args.eval_every == 0 or step == total_steps:
            tr, va = evaluate(train_eval_batches), evaluate(val_batches)
            history.append({"step": step, "train_loss": tr, "val_loss": va,
                            "elapsed_s": round(time.time() - budget_start, 1)})
            print(f"eval step {step}: train {tr:.4f} val {va:.4f} (ppl {math.exp(va):.1f})",
                  flush=True)
            if best is None or va < best[0]:
                best = (va, step, {k: v.detach().clone() for k, v in model.state_dict().items()})
    train_time = time.time() - budget_start
    final = history[-1]
    if best[1] != step:  # never ship an over-fitted end point: keep the best-validation weights
        print(f"restoring best-validation weights from step {best[1]} (val {best[0]:.4f})")
        model.load_state_dict(best[2])
        final = next(h for h in history if h["step"] == best[1])

    # (d) save
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("pytorch_model.bin", "model.safetensors", "config.json", "generation_config.json"):
        (out / stale).unlink(missing_ok=True)
    model.eval()
    model.save_pretrained(str(out), safe_serialization=True)
    save_tokenizer(tok, out, args.n_positions)
    for f in out.iterdir():
        if f.is_file():
            f.chmod(0o644)
    meta = {
        "corpus": "Jane Austen, six completed novels (public domain)",
        "corpus_package": "r-cran-janeaustenr 1.0.0-1 (Debian 12), packaging janeaustenr 1.0.0 (MIT)",
        "corpus_chars": total_chars,
        "train_tokens": int(len(train_ids)),
        "val_tokens": int(len(val_ids)),
        "n_params": n_params,
        "steps": step,
        "batch_size": B,
        "seq_len": T,
        "train_seconds": round(train_time, 1),
        "saved_step": final["step"],
        "final_train_loss": round(final["train_loss"], 4),
        "final_val_loss": round(final["val_loss"], 4),
        "history": history,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "torch": torch.__version__,
    }
    print("TRAINING_SUMMARY " + json.dumps(meta), flush=True)
    print(f"saved to {out}: " + ", ".join(sorted(p.name for p in out.iterdir())), flush=True)

    # quick reload + samples
    from tokenizers import Tokenizer
    m2 = GPT2LMHeadModel.from_pretrained(str(out))
    t2 = Tokenizer.from_file(str(out / "tokenizer.json"))
    for prompt in ("Once upon a time", "It was a fine morning, and", "She said that"):
        ids = torch.tensor([t2.encode(prompt).ids])
        g = m2.generate(ids, max_new_tokens=60, do_sample=False, pad_token_id=eot_id)
        print(f"[greedy] {t2.decode(g[0].tolist())!r}")
        torch.manual_seed(args.seed)
        g = m2.generate(ids, max_new_tokens=60, do_sample=True, temperature=0.8, top_k=40,
                        pad_token_id=eot_id)
        print(f"[sample] {t2.decode(g[0].tolist())!r}")
    print(f"total wall time {time.time() - t_start:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
