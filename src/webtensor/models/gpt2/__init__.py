"""GPT-2: Hugging Face checkpoints, tokenizer, KV-cached generation, sampling, CLI."""

from .config import GPT2Config
from .model import GPT2
from .tokenizer import GPT2Tokenizer

__all__ = ["GPT2", "GPT2Config", "GPT2Tokenizer"]
