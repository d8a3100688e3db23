"""Run the web page in real headless Chromium (Debian's `chromium`, driven by the npm package
`playwright-core` through `drive.cjs`), for the tests and the browser benchmark.

    python -m webtensor.web.headless [--model DIR|FILE.gguf|ID] [--dtype float32|float16|int8] [--bench]
        [--chat] [--screenshot out/page.png] [--prompt TEXT] [--tokens N] [--timeout SECONDS]

prints the adapter, the generated text (with --chat: the model's reply to the prompt as a chat message),
tokens/s and (with --bench) the per-dispatch cost and greedy decode tokens/s with each token read back as it is
chosen (the page's streaming, `follow_steps` 1) and with readbacks of up to 16 steps, alternated twice.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .server import WEB_DIR, SetupError, find_pyodide, serve_in_thread

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str:
    env = os.environ.get("WEBTENSOR_CHROMIUM")
    if env:
        return env
    for n in CHROMIUM_NAMES:
        p = shutil.which(n)
        if p:
            return p
    raise SetupError("no Chromium found (looked for " + ", ".join(CHROMIUM_NAMES) + " on PATH and "
                     "$WEBTENSOR_CHROMIUM); install it with `bash setup.sh --web` (apt-get install chromium)")


def find_node() -> str:
    p = shutil.which("node") or shutil.which("nodejs")
    if not p:
        raise SetupError("Node.js is missing; install it with `bash setup.sh --web` "
                         "(apt-get install nodejs npm)")
    return p


def find_node_modules() -> Path:
    """The node_modules folder holding playwright-core: the repository's (or the working directory's), else the one
    beside the Pyodide in use."""
    from .server import PACKAGE_DIR

    cands = [PACKAGE_DIR.parent.parent / "node_modules", Path.cwd() / "node_modules", find_pyodide().parent]
    for nm in cands:
        if (nm / "playwright-core" / "package.json").is_file():
            return nm
    raise SetupError(f"playwright-core is not installed in {cands[0]}; run `bash setup.sh --web` (npm install)")


def run_page(tasks: list[dict[str, Any]], models: Sequence[Any] = (), timeout_s: float = 240,
             work_dir: Path | None = None, **options: Any) -> dict[str, Any]:
    """Serve the page on 127.0.0.1 with `models` (sources as `webtensor web --model` takes them; the shipped
    model is served too), open it in headless Chromium, run `tasks` (see drive.cjs) and return the results.
    `options` go to the driver (query="?model=ID", webgpu=False, expectError=True), but pyodide_dir: the Pyodide
    distribution the server offers (default: node_modules/pyodide, or $WEBTENSOR_PYODIDE_DIR). Raises SetupError when
    Chromium, Node or the npm packages are missing. The result's `served` holds the body bytes the server sent,
    by path (`WebApp.sent`)."""
    chromium, node, nm = find_chromium(), find_node(), find_node_modules()
    srv, url = serve_in_thread(models=models, pyodide_dir=options.pop("pyodide_dir", None))
    with tempfile.TemporaryDirectory(prefix="webtensor-drive-", dir=work_dir) as td:
        cfg_path, res_path = Path(td) / "config.json", Path(td) / "results.json"
        cfg = dict(url=url, chromium=chromium, nodeModules=str(nm), results=str(res_path),
                   timeoutMs=int(timeout_s * 1000), tasks=tasks, **options)
        cfg_path.write_text(json.dumps(cfg))
        try:
            proc = subprocess.run([node, str(WEB_DIR / "drive.cjs"), str(cfg_path)], capture_output=True,
                                  text=True, timeout=timeout_s + 60)
        finally:
            srv.shutdown()
            srv.server_close()
        served = dict(srv.webtensor_app.sent)  # type: ignore[attr-defined]
        if not res_path.is_file():
            raise RuntimeError(f"the Chromium driver wrote no results (exit {proc.returncode}):\n"
                               f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
        out: dict[str, Any] = json.loads(res_path.read_text())
    out["exit_code"] = proc.returncode
    out["served"] = served
    out["driver_stderr"] = proc.stderr[-4000:]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m webtensor.web.headless", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="a checkpoint directory, .gguf file or cached id (default: the "
                                                 "shipped model)")
    p.add_argument("--prompt", default="It is a truth universally acknowledged")
    p.add_argument("--tokens", type=int, default=40)
    p.add_argument("--dtype", default=None, help="the weights' dtype (the page's ?dtype=; default: the server's)")
    p.add_argument("--chat", action="store_true", help="send the prompt as a chat message instead")
    p.add_argument("--bench", action="store_true", help="also measure per-dispatch cost and decode tokens/s")
    p.add_argument("--screenshot", default=None, help="save a screenshot of the page after generation here")
    p.add_argument("--timeout", type=float, default=240, help="seconds the page session may take (default 240)")
    a = p.parse_args(argv)
    tasks: list[dict[str, Any]] = [
        dict(type="chat_ui", message=a.prompt, maxNewTokens=a.tokens, temperature=0) if a.chat else
        dict(type="generate_ui", prompt=a.prompt, maxNewTokens=a.tokens, temperature=0)]
    if a.screenshot:
        Path(a.screenshot).parent.mkdir(parents=True, exist_ok=True)
        tasks.append(dict(type="screenshot", path=str(Path(a.screenshot).resolve())))
    if a.bench:
        for follow in (16, 1, 16, 1):
            opts = dict(gen=dict(prompt=a.prompt, max_new_tokens=a.tokens, follow_steps=follow),
                        **({} if follow == 16 and len(tasks) < 3 else {"dispatch": {"n": 1}}))
            tasks.append(dict(type="bench", options=json.dumps(opts)))
    try:
        models = [a.model] if a.model else []
        query: dict[str, Any] = dict(query=f"?dtype={a.dtype}") if a.dtype else {}
        out = run_page(tasks, models, timeout_s=a.timeout, **query)
    except SetupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    boot = out.get("boot") or {}
    print(f"adapter: {(boot.get('info') or {}).get('adapter')}  boot: {out['ms'].get('boot')} ms")
    print(f"model: {json.dumps(boot.get('model'))}\nweights: {boot.get('weights')}")
    for t in out["tasks"]:
        if t.get("error"):
            print(f"[{t['type']}] FAILED: {t['error']}")
        elif t["type"] in ("generate_ui", "chat_ui"):
            r = t["result"]
            print(f"[{t['type'][:-3]}] {r['new_tokens']} tokens, decode {r['tokens_per_s']:.2f} tokens/s, "
                  f"prefill+first {r['prefill_s'] * 1000:.0f} ms\n{t.get('output') or r['text']}")
        elif t["type"] == "bench":
            res = json.loads(t["results"]) if isinstance(t["results"], str) else t["results"]
            g = res.pop("generate", None)
            if g:
                print(f"[bench] decode, readbacks of up to {g['follow_steps']} steps: {g['tokens_per_s']:.2f} "
                      f"tokens/s ({g['new_tokens']} tokens; prompt of {g['prompt_tokens']} + first "
                      f"{g['prefill_s'] * 1000:.0f} ms)")
            print("[bench] " + json.dumps(res))
        elif t["type"] == "screenshot":
            print(f"[screenshot] {t['path']}")
    if out.get("error"):
        print("error: " + out["error"], file=sys.stderr)
        print("\n".join(out.get("console", [])[-30:]), file=sys.stderr)
    return 0 if out["exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
