"""webtensor in the browser: the web page (Pyodide running webtensor's numpy-free paths on `navigator.gpu`:
any model `load_model` reads, completion and chat; `app.py` is what its JavaScript calls), its server
(`webtensor web`: the models it offers and their files), and the headless-Chromium runner."""

DTYPES = ("float32", "float16", "int8")  # what the page loads a float checkpoint in (a GGUF file: as stored)
