"""Text: byte-level BPE in pure Python (`bpe`), the tokenizer file formats it and `tokenizers` read
(`tokenizer_files`: tokenizer.json, vocab.json + merges.txt, checked once for every path) and the
Unicode normalizers they may name (`unicode_norm`). Model-agnostic; GPT-2's tokenizer is built on it."""
