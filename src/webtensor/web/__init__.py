"""webtensor in the browser: the WebGPU backend over `navigator.gpu` (Pyodide), a numpy-free GPT-2
driver, the web page and its server (`webtensor web`), and the headless-Chromium runner."""

DTYPES = ("float32", "float16", "int8")  # what the page loads a float checkpoint in (a GGUF file: as stored)
