"""Text: the tokenizer of every byte-level BPE family (`tokenizer.Tokenizer`: GPT-2, Llama 3.x, Qwen2/2.5/3,
SmolLM2, from a checkpoint directory or GGUF metadata), the files and metadata it reads, checked once for
every path (`tokenizer_files`), and its pure-Python twin for the page: BPE (`bpe`), pre-tokenizer steps
with Unicode classes (`pretok`) and normalizers (`unicode_norm`). Model-agnostic."""
