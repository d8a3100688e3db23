"""The vocabulary the decoder-only families share, so that a family imports nothing private from another:
`config` (`DecoderConfig` and the standard Hugging Face / GGUF keys), `rope` (rotary parameters of every scaling
a supported family uses, and their tables), `names` (the standard tensor map and llama.cpp's GGUF names) and
`layers` (attention projections and gated MLPs over ops, for the families' forwards)."""
