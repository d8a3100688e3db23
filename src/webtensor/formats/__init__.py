"""Weight formats beyond safetensors: llama.cpp's q8_0 quantization and GGUF checkpoints."""
