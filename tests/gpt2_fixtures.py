"""Random-init Hugging Face GPT-2 checkpoints, written with save_pretrained into temp dirs."""

from __future__ import annotations

from pathlib import Path

CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's a test, isn't it? We'll see what they'd say.",
    "Héllo wörld — naïve café. Привет мир. 你好世界. Γειά σου κόσμε. 😀👍🏽 🇫🇷",
    "Once upon a time there was a little model that generated text, one token at a time.\n\n  \t end",
]


def make_tokenizer(d: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 20, trainer)
    tok.save(str(d / "tokenizer.json"))


def make_checkpoint(d: Path, *, vocab_size: int, n_embd: int, n_layer: int, n_head: int, n_positions: int = 96,
                    seed: int = 0, init: float = 0.3, **config: object) -> Path:
    """A GPT2LMHeadModel with random weights (std `init`, large enough that greedy text varies);
    `config`: further GPT2Config fields."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    eos = 256  # the tokenizer's <|endoftext|> (first id after the 256 byte tokens)
    cfg = GPT2Config(**{**dict(vocab_size=vocab_size, n_positions=n_positions, n_embd=n_embd, n_layer=n_layer,
                               n_head=n_head, initializer_range=init, bos_token_id=eos, eos_token_id=eos), **config})
    model = GPT2LMHeadModel(cfg).eval()
    d.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(d), safe_serialization=True)
    make_tokenizer(d, min(vocab_size, 400))
    return d
