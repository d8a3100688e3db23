"""The Gemma family: Gemma (`gemma`), Gemma 2 (`gemma2`) and Gemma 3's text model (`gemma3_text`; GGUF `gemma3`).
Its config (`config.py`), tensor map (`names.py`) and forward over ops (`forward.py`); `family.py` registers it."""
