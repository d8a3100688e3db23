"""`webtensor web`: serve the GPT-2 web page on 127.0.0.1.

What it serves:
    /                    index.html, app.js (this folder), gpu_helper.js (backends/wgpu)
    /pyodide/...         the Pyodide distribution from the npm package `setup.sh --web` installs
                         (node_modules/pyodide in the repository, or --pyodide DIR /
                         $WEBTENSOR_PYODIDE_DIR)
    /webtensor.zip       webtensor's Python sources and WGSL kernels, zipped in memory (the page
                         unpacks them into Pyodide's file system)
    /model/manifest.json and /model/<file>
                         the checkpoint: the model shipped with webtensor, or --model DIR
    /model/manifest.json?dtype=int8 and /model/model.q8_0.gguf
                         the same checkpoint for the page's int8: its matrices in llama.cpp's q8_0
                         (a GGUF file written from the safetensors by `formats.gguf_writer` on the
                         first request and kept in memory; ~0.27x the float32 bytes of the matrices)
                         beside config.json and the tokenizer files
Only files of those folders are served; nothing else on the machine is reachable through it.
"""

from __future__ import annotations

import argparse
import io
import json
import mimetypes
import os
import threading
import webbrowser
import zipfile
from functools import cached_property
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from .. import cmdline
from ..errors import UsageError, WebtensorError
from . import DTYPES

WEB_DIR = Path(__file__).resolve().parent
PACKAGE_DIR = WEB_DIR.parent
PAGE_FILES = {"index.html": WEB_DIR, "app.js": WEB_DIR,
              "gpu_helper.js": PACKAGE_DIR / "backends" / "wgpu"}  # name -> folder
MODEL_FILES = ("config.json", "tokenizer.json", "vocab.json", "merges.txt")
Q8_GGUF = "model.q8_0.gguf"  # the int8 weights, written at serve time
MIME = {".wasm": "application/wasm", ".mjs": "text/javascript", ".js": "text/javascript",
        ".json": "application/json", ".html": "text/html; charset=utf-8", ".zip": "application/zip",
        ".map": "application/json", ".txt": "text/plain; charset=utf-8"}


class SetupError(WebtensorError, RuntimeError):
    """Something the page needs is not installed or not found; the message says how to fix it."""


def find_pyodide(explicit: str | os.PathLike | None = None) -> Path:
    """The folder holding pyodide.js, pyodide.asm.wasm and python_stdlib.zip."""
    cands = []
    if explicit:
        cands.append(Path(explicit))
    if os.environ.get("WEBTENSOR_PYODIDE_DIR"):
        cands.append(Path(os.environ["WEBTENSOR_PYODIDE_DIR"]))
    cands += [PACKAGE_DIR.parent.parent / "node_modules" / "pyodide", Path.cwd() / "node_modules" / "pyodide"]
    for c in cands:
        if (c / "pyodide.js").is_file() and (c / "pyodide.asm.wasm").is_file():
            return c.resolve()
    raise SetupError(
        "Pyodide was not found (looked in " + ", ".join(str(c) for c in cands) + "). Install it from the "
        "repository root with `bash setup.sh --web` (npm install of package.json), or pass --pyodide DIR"
    )


def default_model_dir() -> Path:
    return PACKAGE_DIR / "models" / "shipped"


def model_files(model_dir: Path) -> list[Path]:
    """The files of a checkpoint the page needs: config, weights (safetensors), tokenizer."""
    if not (model_dir / "config.json").is_file():
        raise SetupError(f"{model_dir} is not a GPT-2 checkpoint (no config.json)")
    weights = sorted(model_dir.glob("*.safetensors"))
    if not weights:
        raise SetupError(f"{model_dir} has no .safetensors weights")
    return [model_dir / f for f in MODEL_FILES if (model_dir / f).is_file()] + weights


def package_zip() -> bytes:
    """webtensor's sources for Pyodide: .py, .wgsl and the page's helper .js, not the model."""
    buf = io.BytesIO()
    root = PACKAGE_DIR.parent
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as z:
        for p in sorted(PACKAGE_DIR.rglob("*")):
            rel = p.relative_to(PACKAGE_DIR)
            skip = "__pycache__" in rel.parts or rel.parts[:2] == ("models", "shipped")
            if skip or not p.is_file():
                continue
            if p.suffix in (".py", ".wgsl", ".js"):
                z.write(p, p.relative_to(root).as_posix())
    return buf.getvalue()


class WebApp:
    """What the handler serves; built once per server."""

    def __init__(self, model_dir: Path | None = None, pyodide_dir: Path | None = None, dtype: str = "float32"):
        if dtype not in DTYPES:
            raise UsageError(f"the page's dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        self.pyodide_dir = find_pyodide(pyodide_dir)
        self.model_dir = Path(model_dir) if model_dir is not None else default_model_dir()
        self.default_dtype = dtype
        self._q8: bytes | None = None
        self._q8_error: str | None = None
        self._q8_lock = threading.Lock()
        self.model_error: str | None = None
        try:
            self.model = {p.name: p for p in model_files(self.model_dir)}
        except SetupError as e:  # the page still loads and says so
            self.model, self.model_error = {}, str(e)

    @cached_property
    def zip_bytes(self) -> bytes:
        return package_zip()

    def q8_gguf(self) -> bytes:
        """The checkpoint as a q8_0 GGUF file, written once (SetupError when it cannot be: a bad
        checkpoint; the message says why)."""
        from ..formats.gguf_writer import gguf_bytes

        with self._q8_lock:
            if self._q8 is None and self._q8_error is None:
                try:
                    self._q8 = gguf_bytes(self.model_dir, "q8_0")
                except WebtensorError as e:
                    self._q8_error = f"the int8 (q8_0) weights could not be written: {e}"
            if self._q8 is None:
                raise SetupError(self._q8_error)
            return self._q8

    def manifest(self, dtype: str | None = None) -> dict[str, Any]:
        """What the page downloads for `dtype` (None: the server's default): {name, dtype, dtypes,
        files: [{name, size}], float32_bytes (the float download, to compare)}. SetupError when
        there is no model (or no int8 file for it)."""
        dtype = dtype or self.default_dtype
        if dtype not in DTYPES:
            raise SetupError(f"unknown dtype {dtype!r}: the page loads {', '.join(DTYPES)}")
        if self.model_error:
            raise SetupError(self.model_error)
        name = "webtensor shipped GPT-2" if self.model_dir == default_model_dir() else self.model_dir.name
        files = [dict(name=n, size=p.stat().st_size) for n, p in self.model.items()
                 if dtype != "int8" or not n.endswith(".safetensors")]
        if dtype == "int8":
            files.append(dict(name=Q8_GGUF, size=len(self.q8_gguf())))
        float32_bytes = sum(p.stat().st_size for p in self.model.values())
        return dict(name=name, dtype=dtype, dtypes=list(DTYPES), files=files, float32_bytes=float32_bytes)


def _handler(app: WebApp, quiet: bool) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "webtensor"

        def log_message(self, fmt: str, *args: Any) -> None:
            if not quiet:
                super().log_message(fmt, *args)

        def _send(self, status: int, body: bytes, ctype: str, cache: bool = False) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "max-age=3600" if cache else "no-cache")
            # cross-origin isolation: finer performance.now() (the page's timings) and SharedArrayBuffer
            self.send_header("Cross-Origin-Resource-Policy", "same-origin")
            self.send_header("Cross-Origin-Opener-Policy", "same-origin")
            self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _file(self, path: Path, cache: bool = False) -> None:
            ctype = MIME.get(path.suffix) or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
            self._send(200, path.read_bytes(), ctype, cache)

        def _not_found(self, why: str = "not found") -> None:
            self._send(HTTPStatus.NOT_FOUND, why.encode(), "text/plain; charset=utf-8")

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            path = unquote(urlsplit(self.path).path)
            if path in ("/", "/index.html"):
                return self._file(WEB_DIR / "index.html")
            name = path.lstrip("/")
            if name in PAGE_FILES:
                return self._file(PAGE_FILES[name] / name)
            if name == "webtensor.zip":
                return self._send(200, app.zip_bytes, MIME[".zip"])
            if name.startswith("pyodide/"):
                rel = name[len("pyodide/"):]
                target = (app.pyodide_dir / rel).resolve()
                if target.parent != app.pyodide_dir or not target.is_file():  # flat folder: no subpaths
                    return self._not_found()
                return self._file(target, cache=True)
            if name == "model/manifest.json":
                dtype = parse_qs(urlsplit(self.path).query).get("dtype", [None])[0]
                try:
                    man = app.manifest(dtype)
                except SetupError as e:
                    return self._not_found(f"no model: {e}")
                return self._send(200, json.dumps(man).encode(), MIME[".json"])
            if name == f"model/{Q8_GGUF}":
                try:
                    return self._send(200, app.q8_gguf(), "application/octet-stream")
                except SetupError as e:
                    return self._not_found(f"no model: {e}")
            if name.startswith("model/"):
                p = app.model.get(name[len("model/"):])
                return self._file(p) if p is not None else self._not_found()
            return self._not_found()

    return Handler


def make_server(host: str = "127.0.0.1", port: int = 0, model_dir: Path | None = None,
                pyodide_dir: Path | None = None, quiet: bool = True, dtype: str = "float32") -> ThreadingHTTPServer:
    """A server for the page (not started); port 0 picks a free port (`server.server_address`).
    `dtype`: what the page loads unless its address says (?dtype=float32 / float16 / int8)."""
    app = WebApp(model_dir, pyodide_dir, dtype)
    srv = ThreadingHTTPServer((host, port), _handler(app, quiet))
    srv.daemon_threads = True
    srv.webtensor_app = app  # type: ignore[attr-defined]
    return srv


def serve_in_thread(**kw: Any) -> tuple[ThreadingHTTPServer, str]:
    """Start a server on a background thread; returns it and its URL. Stop with `.shutdown()`."""
    srv = make_server(**kw)
    threading.Thread(target=srv.serve_forever, name="webtensor-web", daemon=True).start()
    host, port = srv.server_address[:2]
    return srv, f"http://{host}:{port}/"


def add_parser(sub: Any) -> None:
    p = cmdline.add_command(sub, "web", run=cmd_web, check=check_web,
                            help="serve the GPT-2 web page (Pyodide + the browser's WebGPU) on 127.0.0.1",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=cmdline.integer("--port", 0, 65535), default=8765,
                   help="port (default 8765; 0 picks a free one)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--no-open", action="store_true", help="do not open the page in a browser")
    p.add_argument("--model", default=None, help="GPT-2 checkpoint directory (default: the shipped model)")
    p.add_argument("--pyodide", default=None,
                   help="Pyodide distribution folder (default: node_modules/pyodide)")
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="the weights the page loads first (default float32; float16 needs the adapter's "
                        "shader-f16; int8: q8_0 matrices, ~0.27x their float32 bytes to download); the page's dtype "
                        "menu and its ?dtype= address switch")


def _is_pyodide(d: Path) -> bool:
    return (d / "pyodide.js").is_file() and (d / "pyodide.asm.wasm").is_file()


def check_web(args: argparse.Namespace) -> None:
    """A Pyodide folder or checkpoint that was named explicitly must be one (no silent fallback)."""
    env = os.environ.get("WEBTENSOR_PYODIDE_DIR")
    for what, value in ((f"--pyodide {args.pyodide}", args.pyodide), (f"WEBTENSOR_PYODIDE_DIR={env}", env)):
        if value and not _is_pyodide(Path(value)):
            raise UsageError(f"{what}: not a Pyodide distribution (no pyodide.js and pyodide.asm.wasm)")
    if args.model is not None:
        if not Path(args.model).is_dir():
            raise SetupError(f"checkpoint directory {args.model} does not exist")
        model_files(Path(args.model))  # SetupError when it lacks config.json or weights


def cmd_web(args: argparse.Namespace) -> int:
    srv = None
    try:
        srv = make_server(args.host, args.port, Path(args.model) if args.model else None,
                          Path(args.pyodide) if args.pyodide else None, quiet=False, dtype=args.dtype)
    except OSError as e:
        raise SetupError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from e
    host, port = srv.server_address[:2]
    url = f"http://{host}:{port}/"
    app = srv.webtensor_app  # type: ignore[attr-defined]
    print(f"webtensor web: serving {url}  (Pyodide from {app.pyodide_dir}; model {app.model_dir}; "
          f"dtype {app.default_dtype})")
    if app.model_error:
        print(f"webtensor web: warning: {app.model_error}; the page will say the model failed to load")
    print("Open it in a browser with WebGPU (Chrome/Edge 113+, Safari 26+). Ctrl-C stops.", flush=True)
    if not args.no_open:
        threading.Timer(0.5, lambda: webbrowser.open(url)).start()
    try:
        srv.serve_forever()  # Ctrl-C: KeyboardInterrupt, exit 130 (cmdline)
    finally:
        srv.server_close()
    return 0
