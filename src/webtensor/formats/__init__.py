"""Weight formats: the pure-Python safetensors reader, llama.cpp's q8_0 quantization and GGUF checkpoints."""
