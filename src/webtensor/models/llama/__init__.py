"""The Llama family: Llama 2/3.x and SmolLM2 (`llama`), Mistral-style configs without a sliding window
(`mistral`), Qwen2/2.5 (`qwen2`) and Qwen3 (`qwen3`). Its config (`config.py`), tensor map (`names.py`) and
forward over ops (`forward.py`); `family.py` registers it."""
