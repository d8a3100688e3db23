"""`webtensor web`: serve the web page (Pyodide + the browser's WebGPU) and the models it runs, on 127.0.0.1.

What it serves:
    /                    index.html, app.js (this folder), gpu_helper.js (backends/wgpu)
    /pyodide/...         the Pyodide distribution from the npm package `setup.sh --web` installs
                         (node_modules/pyodide in the repository, or --pyodide DIR /
                         $WEBTENSOR_PYODIDE_DIR)
    /webtensor.zip       webtensor's Python sources and WGSL kernels, with jinja2 and markupsafe (the
                         chat templates; pure Python, their BSD licenses beside them), zipped in memory:
                         the page unpacks them into Pyodide's file system
    /model/manifest.json the models (`--model`, as many as given, then the model shipped with webtensor):
                         each one's id, name, format, the dtypes the page can load it in and the files
                         (with sizes) each dtype downloads
    /model/<id>/<file>   a file of a served model: a checkpoint directory's config, tokenizer, chat
                         template and safetensors; a GGUF file itself; or model.q8_0.gguf, a float
                         checkpoint's matrices in llama.cpp's q8_0 for the page's int8, written from
                         the safetensors by `formats.gguf_writer` on its first request and kept in
                         memory (~0.27x the float32 bytes of the matrices)
A float checkpoint loads in float32, float16 (adapters with shader-f16) or int8; a GGUF file as stored
(its quantized blocks uploaded as they are). Nothing but the files listed in the manifest (and the page's
own) is reachable through the server.

Caching: every response carries a strong validator (`ETag`: a file's inode, size and modification time, as
nginx makes it; for bytes made in memory, a hash of them) and a file its `Last-Modified`; a request whose
`If-None-Match` (else `If-Modified-Since`) matches is answered 304 with no body. Model files and the page's
own are `Cache-Control: no-cache` (kept, revalidated on each use); the manifest lists each model file's
ETag, so the page (which keeps model files in Cache Storage) uses its copy without asking when they agree.
Pyodide's files may be used for an hour unasked. `WebApp.sent` counts the body bytes sent per path.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import mimetypes
import os
import re
import shutil
import threading
import webbrowser
import zipfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from email.utils import formatdate, parsedate_to_datetime
from functools import cached_property
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from .. import cmdline
from ..errors import UsageError, WebtensorError
from . import DTYPES

WEB_DIR = Path(__file__).resolve().parent
PACKAGE_DIR = WEB_DIR.parent
PAGE_FILES = {"index.html": WEB_DIR, "app.js": WEB_DIR,
              "gpu_helper.js": PACKAGE_DIR / "backends" / "wgpu"}  # name -> folder
# what the loader reads from a checkpoint directory besides its *.safetensors (and additional_chat_templates/)
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "vocab.json", "merges.txt",
               "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
Q8_GGUF = "model.q8_0.gguf"  # a float checkpoint's int8 weights, written at serve time
SHIPPED_ID = "webtensor-shipped"
THIRD_PARTY = ("jinja2", "markupsafe")  # pure-Python packages the page's zip carries (chat templates)
NO_CACHE = "no-cache"  # a response may be kept, but is revalidated (ETag / Last-Modified) before each use
MIME = {".wasm": "application/wasm", ".mjs": "text/javascript", ".js": "text/javascript",
        ".json": "application/json", ".html": "text/html; charset=utf-8", ".zip": "application/zip",
        ".map": "application/json", ".txt": "text/plain; charset=utf-8", ".jinja": "text/plain; charset=utf-8"}


class SetupError(WebtensorError, RuntimeError):
    """Something the page needs is not installed or not found; the message says how to fix it."""


@dataclass(frozen=True)
class Validators:
    """What identifies one version of a response body: a strong ETag (quoted) and, for a file, its
    modification time (seconds since the epoch)."""

    etag: str
    mtime: float | None = None

    @classmethod
    def of_stat(cls, st: os.stat_result) -> Validators:
        return cls(f'"{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}"', st.st_mtime)

    @classmethod
    def of_bytes(cls, body: bytes) -> Validators:
        return cls(f'"{hashlib.sha256(body).hexdigest()[:32]}"')

    def matches(self, if_none_match: str | None, if_modified_since: str | None) -> bool:
        """Whether a conditional GET with these headers may be answered 304 (RFC 9110 13.1.2 / 13.1.3:
        If-None-Match, when present, decides alone, by weak comparison; If-Modified-Since is a date)."""
        if if_none_match is not None:
            tags = [t.strip() for t in if_none_match.split(",")]
            return "*" in tags or any(t.removeprefix("W/") == self.etag for t in tags)
        if if_modified_since is None or self.mtime is None:
            return False
        try:
            since = parsedate_to_datetime(if_modified_since).timestamp()
        except (TypeError, ValueError, IndexError, OverflowError):
            return False  # an unreadable date: send the body
        return int(self.mtime) <= since


def find_pyodide(explicit: str | os.PathLike[str] | None = None) -> Path:
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


def pyodide_numpy(pyodide_dir: Path) -> str | None:
    """The numpy wheel that the Pyodide distribution in `pyodide_dir` lists (pyodide-lock.json) and holds, with the
    wheels it depends on, so the page can load it offline (`pyodide.loadPackage("numpy")`) and run models on
    webtensor's CPU device: its file name, else None (npm's `pyodide` package is core only: it lists numpy but holds
    no wheel; Pyodide's full release holds them all)."""
    try:
        packages = json.loads((pyodide_dir / "pyodide-lock.json").read_text(encoding="utf-8"))["packages"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    todo, seen = ["numpy"], set()
    while todo:
        name = todo.pop()
        entry = packages.get(name) if isinstance(packages, dict) else None
        if not isinstance(entry, dict) or not isinstance(entry.get("file_name"), str) \
                or not (pyodide_dir / entry["file_name"]).is_file():
            return None
        seen.add(name)
        todo += [d for d in entry.get("depends", ()) if d not in seen]
    return str(packages["numpy"]["file_name"])


def default_model_dir() -> Path:
    return PACKAGE_DIR / "models" / "shipped"


def model_files(model_dir: Path) -> list[Path]:
    """The files of a checkpoint directory the page needs: config, tokenizer, chat templates, weights."""
    if not (model_dir / "config.json").is_file():
        raise SetupError(f"{model_dir} is not a checkpoint directory (no config.json)")
    weights = sorted(model_dir.glob("*.safetensors"))
    if not weights:
        raise SetupError(f"{model_dir} has no .safetensors weights")
    extra = sorted((model_dir / "additional_chat_templates").glob("*.jinja"))
    return [model_dir / f for f in MODEL_FILES if (model_dir / f).is_file()] + extra + weights


def package_zip() -> bytes:
    """webtensor's sources for Pyodide (.py, .wgsl and the page's helper .js, not the model), and jinja2's and
    markupsafe's .py files with their licenses (markupsafe's optional C speedups left out: its pure-Python
    fallback runs)."""
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
        for name in THIRD_PARTY:
            for arcname, data in third_party_files(name):
                z.writestr(arcname, data)
    return buf.getvalue()


def third_party_files(package: str) -> list[tuple[str, bytes]]:
    """(path in the zip, bytes) of an installed pure-Python package: its .py files and its license as
    `<package>/LICENSE.txt`. SetupError where it is not installed."""
    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError as e:
        raise SetupError(f"the page's chat templates need {package}, which is not installed "
                         f"(pip install {package})") from e
    out = []
    licenses = []
    for f in dist.files or ():
        parts = Path(str(f)).parts
        if parts[0] == package and f.suffix == ".py":
            out.append((Path(*parts).as_posix(), Path(str(dist.locate_file(f))).read_bytes()))
        elif parts[0].endswith(".dist-info") and "LICENSE" in f.name.upper():
            licenses.append(Path(str(dist.locate_file(f))).read_bytes())
    if not out or not licenses:
        raise SetupError(f"{package} {dist.version} is installed without its .py files or license")
    return sorted(out) + [(f"{package}/LICENSE.txt", b"\n".join(licenses))]


# -- the served models ---------------------------------------------------------------------------------
@dataclass
class ServedModel:
    """One model the page may load: `files` (the names the page asks for -> the files served under them) are
    all the server will read of it."""

    id: str  # its address: /model/<id>/...; letters, digits, '.', '_', '-'
    name: str  # shown in the page's menu
    path: Path  # the checkpoint directory or the .gguf file
    gguf: bool
    files: dict[str, Path]
    stored: str  # a GGUF file's weight type (its matrices' most common one by bytes); "float" otherwise
    _q8: bytes | None = None
    _q8_validators: Validators | None = None
    _q8_error: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def dtypes(self) -> list[str]:
        """What the page can load it in: a float checkpoint in any of `DTYPES`, a GGUF file as stored."""
        return [self.stored] if self.gguf else list(DTYPES)

    def q8_gguf(self) -> tuple[bytes, Validators]:
        """The checkpoint as a q8_0 GGUF file, written once, and its validators (SetupError when it cannot be:
        a bad checkpoint; the message says why, every time)."""
        from ..formats.gguf_writer import gguf_bytes

        if self.gguf:
            raise SetupError(f"{self.name} is a GGUF file: the page loads it as stored")
        with self._lock:
            if self._q8 is None and self._q8_error is None:
                try:
                    self._q8 = gguf_bytes(self.path, "q8_0")
                    self._q8_validators = Validators.of_bytes(self._q8)
                except WebtensorError as e:
                    self._q8_error = f"the int8 (q8_0) weights of {self.name} could not be written: {e}"
            if self._q8 is None or self._q8_validators is None:
                raise SetupError(self._q8_error)
            return self._q8, self._q8_validators

    def downloads(self, dtype: str) -> list[dict[str, Any]]:
        """The files the page downloads for `dtype`: [{name, size, etag}] (the int8 GGUF's size and ETag are
        None until the server has written it)."""
        if dtype == "int8" and not self.gguf:
            v = self._q8_validators
            return [dict(name=Q8_GGUF, size=None if self._q8 is None else len(self._q8),
                         etag=None if v is None else v.etag)]
        out = []
        for n, p in self.files.items():
            st = p.stat()
            out.append(dict(name=n, size=st.st_size, etag=Validators.of_stat(st).etag))
        return out

    def describe(self) -> dict[str, Any]:
        return dict(id=self.id, name=self.name, format="gguf" if self.gguf else "safetensors", stored=self.stored,
                    dtypes=self.dtypes, files={d: self.downloads(d) for d in self.dtypes})


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.") or "model"


def _gguf_stored_type(path: Path) -> str:
    """A GGUF file's weight type: the ggml type of most of its matrices' bytes (Q4_1 for a Q4_1 file, whose
    embedding may be Q8_0 and norms F32). CheckpointError for a file that is not GGUF."""
    from ..formats.gguf_reader import GGUFCheckpoint

    f = GGUFCheckpoint(path, "pure")
    weight: Counter[str] = Counter()
    for t in f.tensors.values():
        if len(t.shape) == 2:
            weight[t.type_name] += t.nbytes
    return weight.most_common(1)[0][0] if weight else "F32"


def served_model(source: Any) -> ServedModel:
    """The ServedModel of `source`: None (the shipped model), a checkpoint directory, a .gguf file (or a
    directory holding one) or an id in the local Hugging Face cache. CheckpointError / SetupError (one line)
    where it is none of these; the checkpoint's contents are checked by `check_model`, not here."""
    from ..formats.gguf_reader import find_gguf
    from ..formats.safetensors_reader import resolve

    if source is None:
        d = default_model_dir()
        return ServedModel(SHIPPED_ID, "webtensor shipped GPT-2", d, False, {p.name: p for p in model_files(d)},
                           "float")
    f = find_gguf(source)
    if f is not None:
        f = f.resolve()
        return ServedModel(_slug(f.stem), f.name, f, True, {f.name: f}, _gguf_stored_type(f))
    d = resolve(source)  # a directory, or an id's snapshot in the local cache
    is_path = Path(source).expanduser().is_dir()
    name = d.resolve().name if is_path else str(source)
    files = {p.relative_to(d).as_posix(): p for p in model_files(d)}
    return ServedModel(_slug(name.replace("/", "--")), name, d.resolve(), False, files, "float")


def check_model(source: Any) -> None:
    """Open `source` as the page will (the pure-Python readers) and check it: its family, config, tensors and
    tokenizer (CheckpointError, one line)."""
    from ..models import loader

    loader.open_checkpoint(source, reader="pure")


class WebApp:
    """What the handler serves; built once per server."""

    def __init__(self, models: Sequence[Any] = (), pyodide_dir: Path | None = None, dtype: str = "float32"):
        """`models`: sources (see `served_model`; CheckpointError / SetupError for one that cannot be served);
        the shipped model is always served too, after them. The same checkpoint named twice is served once."""
        if dtype not in DTYPES:
            raise UsageError(f"the page's dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        self.pyodide_dir = find_pyodide(pyodide_dir)
        self.numpy_wheel = pyodide_numpy(self.pyodide_dir)  # None: the page runs on WebGPU only
        self.default_dtype = dtype
        self.models: dict[str, ServedModel] = {}
        self.sent: Counter[str] = Counter()  # body bytes sent, by path (what a cold / warm visit costs)
        self._sent_lock = threading.Lock()
        for src in [*models, None]:
            m = served_model(src)
            if any(m.path == other.path for other in self.models.values()):
                continue
            base, n = m.id, 2
            while m.id in self.models:
                m.id, n = f"{base}-{n}", n + 1
            self.models[m.id] = m

    @cached_property
    def zip_bytes(self) -> bytes:
        return package_zip()

    @cached_property
    def zip_validators(self) -> Validators:
        return Validators.of_bytes(self.zip_bytes)

    def count_sent(self, path: str, n: int) -> None:
        with self._sent_lock:
            self.sent[path] += n

    def model_bytes_sent(self) -> int:
        """Body bytes of model files sent so far (the manifest not counted)."""
        with self._sent_lock:
            return sum(n for p, n in self.sent.items() if p.startswith("/model/") and p != "/model/manifest.json")

    @property
    def default(self) -> str:
        """The model the page loads first: the first one given."""
        return next(iter(self.models))

    def manifest(self) -> dict[str, Any]:
        """What the page can load: {default: {model, dtype}, models: [ServedModel.describe(), ...], cpu: whether
        the page can run models on webtensor's CPU device (the Pyodide served has numpy)} (the default dtype:
        `--dtype` for a float checkpoint, a GGUF file's stored type)."""
        first = self.models[self.default]
        return dict(default=dict(model=first.id, dtype=first.stored if first.gguf else self.default_dtype),
                    models=[m.describe() for m in self.models.values()], cpu=self.numpy_wheel is not None)

    def model_file(self, model_id: str, name: str) -> Path | tuple[bytes, Validators]:
        """A served model's file (its path, or the int8 GGUF's bytes and validators); SetupError for an unknown
        one."""
        m = self.models.get(model_id)
        if m is None:
            raise SetupError(f"no model {model_id!r} is served")
        if name == Q8_GGUF and not m.gguf:
            return m.q8_gguf()
        p = m.files.get(name)
        if p is None:
            raise SetupError(f"{m.name} has no file {name!r}")
        return p


def _handler(app: WebApp, quiet: bool) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "webtensor"
        # HTTP/1.1: browsers revalidate with an ETag only from 1.1 responses (every response here has a
        # Content-Length, or no body, so connections are kept alive)
        protocol_version = "HTTP/1.1"
        _path = ""  # the request's path, unquoted

        def log_message(self, fmt: str, *args: Any) -> None:
            if not quiet:
                super().log_message(fmt, *args)

        def _head(self, status: int, size: int | None, ctype: str, cache: str,
                  validators: Validators | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            if size is not None:
                self.send_header("Content-Length", str(size))
            self.send_header("Cache-Control", cache)
            if validators is not None:
                self.send_header("ETag", validators.etag)
                if validators.mtime is not None:
                    self.send_header("Last-Modified", formatdate(validators.mtime, usegmt=True))
            # cross-origin isolation: finer performance.now() (the page's timings) and SharedArrayBuffer
            self.send_header("Cross-Origin-Resource-Policy", "same-origin")
            self.send_header("Cross-Origin-Opener-Policy", "same-origin")
            self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
            self.end_headers()

        def _unchanged(self, ctype: str, cache: str, validators: Validators) -> bool:
            """Answers 304 (no body) when the request's validators match; whether it did."""
            if self.command not in ("GET", "HEAD") or not validators.matches(
                    self.headers.get("If-None-Match"), self.headers.get("If-Modified-Since")):
                return False
            self._head(HTTPStatus.NOT_MODIFIED, None, ctype, cache, validators)
            return True

        def _send(self, status: int, body: bytes, ctype: str, cache: str = NO_CACHE,
                  validators: Validators | None = None) -> None:
            if validators is not None and self._unchanged(ctype, cache, validators):
                return
            self._head(status, len(body), ctype, cache, validators)
            if self.command != "HEAD":
                app.count_sent(self._path, len(body))  # (before: a client may have it all before write returns)
                self.wfile.write(body)

        def _file(self, path: Path, cache: str = NO_CACHE) -> None:
            ctype = MIME.get(path.suffix) or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
            with path.open("rb") as f:  # streamed: a model file may be large
                st = os.fstat(f.fileno())
                validators = Validators.of_stat(st)
                if self._unchanged(ctype, cache, validators):
                    return
                self._head(200, st.st_size, ctype, cache, validators)
                if self.command != "HEAD":
                    app.count_sent(self._path, st.st_size)
                    try:
                        shutil.copyfileobj(f, self.wfile, 1 << 20)
                    except (BrokenPipeError, ConnectionResetError):  # the page went away mid-download (a reload)
                        self.close_connection = True

        def _not_found(self, why: str = "not found") -> None:
            self._send(HTTPStatus.NOT_FOUND, why.encode(), "text/plain; charset=utf-8")

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            path = self._path = unquote(urlsplit(self.path).path)
            if path in ("/", "/index.html"):
                return self._file(WEB_DIR / "index.html")
            name = path.lstrip("/")
            if name in PAGE_FILES:
                return self._file(PAGE_FILES[name] / name)
            if name == "webtensor.zip":
                return self._send(200, app.zip_bytes, MIME[".zip"], validators=app.zip_validators)
            if name.startswith("pyodide/"):
                rel = name[len("pyodide/"):]
                target = (app.pyodide_dir / rel).resolve()
                if target.parent != app.pyodide_dir or not target.is_file():  # flat folder: no subpaths
                    return self._not_found()
                return self._file(target, cache="max-age=3600")
            if name == "model/manifest.json":
                return self._send(200, json.dumps(app.manifest()).encode(), MIME[".json"])
            if name.startswith("model/") and name.count("/") >= 2:
                model_id, file = name[len("model/"):].split("/", 1)
                try:  # only a served model's own files: exact names from its listing
                    found = app.model_file(model_id, file)
                except SetupError as e:
                    return self._not_found(f"no such model file: {e}")
                if isinstance(found, Path):
                    return self._file(found)
                return self._send(200, found[0], "application/octet-stream", validators=found[1])
            return self._not_found()

    return Handler


def make_server(host: str = "127.0.0.1", port: int = 0, models: Sequence[Any] = (),
                pyodide_dir: Path | None = None, quiet: bool = True, dtype: str = "float32") -> ThreadingHTTPServer:
    """A server for the page (not started); port 0 picks a free port (`server.server_address`). `models`: the
    sources served besides the shipped model (the first is the page's default). `dtype`: what the page loads a
    float checkpoint in unless its address says (?dtype=float32 / float16 / int8)."""
    app = WebApp(models, pyodide_dir, dtype)
    srv = ThreadingHTTPServer((host, port), _handler(app, quiet))
    srv.daemon_threads = True
    srv.webtensor_app = app  # type: ignore[attr-defined]
    return srv


def serve_in_thread(**kw: Any) -> tuple[ThreadingHTTPServer, str]:
    """Start a server on a background thread; returns it and its URL. Stop with `.shutdown()`."""
    srv = make_server(**kw)
    threading.Thread(target=srv.serve_forever, name="webtensor-web", daemon=True).start()
    return srv, _url(srv)


def _url(srv: ThreadingHTTPServer) -> str:
    host, port = srv.server_address[:2]
    return f"http://{host.decode() if isinstance(host, bytes) else host}:{port}/"


def add_parser(sub: Any) -> None:
    p = cmdline.add_command(sub, "web", run=cmd_web, check=check_web,
                            help="serve the web page (Pyodide + the browser's WebGPU): completion and chat with "
                                 "the models given, on 127.0.0.1",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=cmdline.integer("--port", 0, 65535), default=8765,
                   help="port (default 8765; 0 picks a free one)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--no-open", action="store_true", help="do not open the page in a browser")
    p.add_argument("--model", "-m", action="append", default=[], metavar="MODEL",
                   help="a model the page offers: a checkpoint directory, a .gguf file or an id in the local "
                        "Hugging Face cache; repeat for several (the first is loaded first; the shipped model is "
                        "always offered too)")
    p.add_argument("--pyodide", default=None,
                   help="Pyodide distribution folder (default: node_modules/pyodide)")
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="what the page loads a float checkpoint in first (default float32; float16 needs the "
                        "adapter's shader-f16; int8: q8_0 matrices, ~0.27x their float32 bytes to download); the "
                        "page's dtype menu and its ?dtype= address switch. A GGUF file loads as stored")


def _is_pyodide(d: Path) -> bool:
    return (d / "pyodide.js").is_file() and (d / "pyodide.asm.wasm").is_file()


def check_web(args: argparse.Namespace) -> None:
    """A Pyodide folder named explicitly must be one, and every --model a checkpoint the page can load
    (no silent fallback)."""
    env = os.environ.get("WEBTENSOR_PYODIDE_DIR")
    for what, value in ((f"--pyodide {args.pyodide}", args.pyodide), (f"WEBTENSOR_PYODIDE_DIR={env}", env)):
        if value and not _is_pyodide(Path(value)):
            raise UsageError(f"{what}: not a Pyodide distribution (no pyodide.js and pyodide.asm.wasm)")
    for source in args.model:
        served_model(source)  # what the server will serve of it
        check_model(source)  # and what the page will read


def cmd_web(args: argparse.Namespace) -> int:
    srv = None
    try:
        srv = make_server(args.host, args.port, args.model, Path(args.pyodide) if args.pyodide else None,
                          quiet=False, dtype=args.dtype)
    except OSError as e:
        raise SetupError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from e
    url = _url(srv)
    app = srv.webtensor_app  # type: ignore[attr-defined]
    print(f"webtensor web: serving {url}  (Pyodide from {app.pyodide_dir})")
    for m in app.models.values():
        print(f"  model {m.id}: {m.path} ({', '.join(m.dtypes)})")
    print("Open it in a browser with WebGPU (Chrome/Edge 113+, Safari 26+). Ctrl-C stops.", flush=True)
    if not args.no_open:
        threading.Timer(0.5, lambda: webbrowser.open(url)).start()
    try:
        srv.serve_forever()  # Ctrl-C: KeyboardInterrupt, exit 130 (cmdline)
    finally:
        srv.server_close()
    return 0
