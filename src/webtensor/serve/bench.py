"""`webtensor bench-serve`: a bounded load generator for a running server.

At each concurrency level C, C clients each send `rounds` streamed /v1/completions requests (greedy,
`max_tokens` tokens each, `ignore_eos` so every request makes all of them), one after another, so
at most C are in flight. Reported per level: aggregate tokens/s (all tokens over the wall time),
time to first token p50/p99 and inter-token latency p50/p99 (gaps between a stream's token events).
With `--hf`, HF transformers' batched `generate` of the same C prompts (greedy, exactly max_tokens
new tokens, left-padded; `--hf-device`, `--hf-dtype`) is timed in the same run, after the server's
levels, for the ratio; `--hf-only` times it alone (no server: e.g. after the server has stopped).
Several servers (comma-separated URLs, e.g. the batched and the reference engine on two ports) are
measured one after another in the same run, each row labelled with the engine its /health names.
`--shared-prefix N`: every prompt starts with the same text of N tokens (a long system prompt), so the
server's prefix reuse shows in TTFT (a server run with `--no-prefix-reuse` beside it for the "before").
`--prompt-tokens N`: every prompt is exactly N tokens, each its own (sent as token ids), so C streams of N +
max_tokens positions hold that much KV cache (tools/h200/serve_8b.sh: 64 streams of 2,048-token contexts).
"""

from __future__ import annotations

import http.client
import json
import platform
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from ..errors import WebtensorError

TOPICS = ["The weather", "A short story about a cat", "In the year 2050", "The best way to cook rice",
          "Once upon a time", "The history of the bicycle", "My favourite song", "How computers work"]


def prompt(i: int, prefix: str = "") -> str:
    """The i-th benchmark prompt: different texts and lengths (after the shared `prefix`, if any)."""
    return prefix + f"{TOPICS[i % len(TOPICS)]}{', part ' + str(i) if i >= len(TOPICS) else ''}" + " and" * (i % 5) \
        + ":"


PREFIX_TEXT = ("You are a careful assistant. Answer in plain words, cite what you rely on, say when you do not "
               "know, and keep to the question. ")

@dataclass
class Stream:
    tokens: int = 0
    ttft: float = 0.0
    gaps: list[float] = field(default_factory=list)


@dataclass
class Level:
    engine: str
    concurrency: int
    requests: int
    tokens: int
    seconds: float
    tok_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    hf_tok_s: float | None = None
    ratio_vs_hf: float | None = None


class Client:
    """A lean streaming client: asyncio over raw sockets, all of a level's streams on one thread
    (the load generator shares the machine with the server, so its own CPU time matters). It reads
    the HTTP/1.1 chunked body itself and looks at each server-sent event only as far as it needs:
    a token event is timed, the usage event's completion_tokens counts the tokens (an event may
    carry several when the server coalesces a stream that fell behind), errors are raised."""

    def __init__(self, url: str, api_key: str | None, model: str | None = None):
        u = urlsplit(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.model = model or self._model()
        self.engine = self._engine()
        self.prefix = ""
        self.prompt_tokens = 0  # (--prompt-tokens: prompts of exactly this many tokens, as ids)
        self._long: dict[int, list[int]] = {}

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        c = self._conn()
        try:
            c.request("POST", path, json.dumps(body), headers=self.headers)
            r = c.getresponse()
            out: dict[str, Any] = json.loads(r.read())
        finally:
            c.close()
        if r.status != 200:
            raise WebtensorError(f"POST {path}: HTTP {r.status}: {out}")
        return out

    def shared_prefix(self, n: int) -> str:
        """A text of exactly `n` tokens by the server's /tokenize (PREFIX_TEXT repeated, cut by /detokenize)."""
        ids = self._post("/tokenize", {"prompt": PREFIX_TEXT * (n // 8 + 1), "add_special_tokens": False})["tokens"]
        if len(ids) < n:
            raise WebtensorError(f"could not make a prefix of {n} tokens")
        return str(self._post("/detokenize", {"tokens": ids[:n]})["prompt"])

    def prompt(self, i: int) -> str | list[int]:
        """The i-th prompt: `prompt(i)` after the shared prefix, or with `prompt_tokens`, exactly that many token ids
        of its own text (prompt(i) and numbered words, by the server's /tokenize)."""
        n = self.prompt_tokens
        if not n:
            return prompt(i, self.prefix)
        if i not in self._long:
            words = " ".join(f"{TOPICS[(i + j) % len(TOPICS)].split()[-1].lower()}{i}x{j}" for j in range(n))
            ids = self._post("/tokenize", {"prompt": f"{prompt(i, self.prefix)} {words}",
                                           "add_special_tokens": False})["tokens"]
            if len(ids) < n:
                raise WebtensorError(f"could not make a prompt of {n} tokens")
            self._long[i] = ids[:n]
        return self._long[i]

    def _conn(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=600)

    def _model(self) -> str:
        c = self._conn()
        try:
            c.request("GET", "/v1/models", headers=self.headers)
            r = c.getresponse()
            body = json.loads(r.read())
        except OSError as e:
            raise WebtensorError(f"no server at http://{self.host}:{self.port}: {e}") from e
        finally:
            c.close()
        if r.status != 200:
            raise WebtensorError(f"GET /v1/models: HTTP {r.status}: {body}")
        model_id: str = body["data"][0]["id"]
        return model_id

    def _engine(self) -> str:
        c = self._conn()
        try:
            c.request("GET", "/health", headers=self.headers)
            body = json.loads(c.getresponse().read())
        except (OSError, ValueError):
            body = {}
        finally:
            c.close()
        return str(body.get("engine") or f"{self.host}:{self.port}")

    def _request(self, text: str | list[int], max_tokens: int) -> bytes:
        body = json.dumps({"model": self.model, "prompt": text, "max_tokens": max_tokens, "temperature": 0,
                           "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}).encode()
        head = "".join(f"{k}: {v}\r\n" for k, v in self.headers.items())
        return (f"POST /v1/completions HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{head}"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body

    async def stream(self, text: str | list[int], max_tokens: int) -> Stream:
        """One streamed completion; its token count, TTFT and the gaps between its token events."""
        import asyncio

        reader, writer = await asyncio.open_connection(self.host, self.port)
        t0 = time.perf_counter()
        try:
            writer.write(self._request(text, max_tokens))
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            if status != 200:
                raise WebtensorError(f"POST /v1/completions: HTTP {status}: {(await reader.read(300))!r}")
            if b"transfer-encoding: chunked" not in head.lower():
                raise WebtensorError("the server's stream is not chunked HTTP/1.1")
            out, last, events, usage = Stream(), None, 0, None
            raw, sse = b"", b""
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    raise WebtensorError("the server closed the stream before its end")
                now = time.perf_counter()
                raw += data
                end = False
                while (i := raw.find(b"\r\n")) >= 0:  # chunked framing: size line, payload, CRLF
                    size = int(raw[:i].split(b";")[0], 16)
                    if len(raw) < i + 2 + size + 2:
                        break
                    sse += raw[i + 2:i + 2 + size]
                    raw = raw[i + 4 + size:]
                    end = end or size == 0
                *done, sse = sse.split(b"\n\n")
                for ev in done:
                    if not ev.startswith(b"data: ") or ev == b"data: [DONE]":
                        continue
                    if ev.startswith(b'data: {"error"'):
                        raise WebtensorError(f"stream error: {json.loads(ev[6:])['error'].get('message')}")
                    if b'"choices":[]' in ev:  # the usage event
                        usage = json.loads(ev[6:]).get("usage") or {}
                        continue
                    if last is None:
                        out.ttft = now - t0
                    else:
                        out.gaps.append(now - last)
                    last = now
                    events += 1
                if end:
                    break
            out.tokens = int(usage["completion_tokens"]) if usage else events
            return out
        finally:
            writer.close()


def run_level(client: Client, c: int, rounds: int, max_tokens: int) -> Level:
    import asyncio

    from tqdm.auto import tqdm

    streams: list[Stream] = []
    with tqdm(total=c * rounds, desc=f"concurrency {c}", unit="req", leave=False) as bar:
        async def one_client(k: int) -> None:
            for r in range(rounds):
                streams.append(await client.stream(client.prompt(k + r * c), max_tokens))
                bar.update(1)

        async def level() -> None:
            await asyncio.gather(*(one_client(k) for k in range(c)))

        t0 = time.perf_counter()
        asyncio.run(level())
        wall = time.perf_counter() - t0
    tokens = sum(s.tokens for s in streams)
    ttft = np.array([s.ttft for s in streams]) * 1e3
    gaps = np.array([g for s in streams for g in s.gaps] or [0.0]) * 1e3
    return Level(client.engine, c, len(streams), tokens, wall, tokens / wall, float(np.percentile(ttft, 50)),
                 float(np.percentile(ttft, 99)), float(np.percentile(gaps, 50)), float(np.percentile(gaps, 99)))


def hf_tok_s(model_spec: str | None, c: int, max_tokens: int, device: str = "cpu", dtype: str = "float32",
             threads: int = 0) -> float:
    """HF transformers' batched greedy generate of the level's first C prompts (on torch `device`,
    in `dtype`, with `threads` torch CPU threads, 0: torch's default): new tokens per second."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    from transformers import AutoModelForCausalLM

    from ..formats.safetensors_reader import resolve
    from ..text.tokenizer import Tokenizer

    d = resolve(model_spec)
    model = AutoModelForCausalLM.from_pretrained(str(d), dtype=getattr(torch, dtype))
    # (transformers wraps `to` in functools.wraps(nn.Module.to): its stub reads `device` as `self`)
    model = model.to(device).eval()  # type: ignore[arg-type]
    tok = Tokenizer.from_dir(d)
    ids = [tok.encode(prompt(k)) for k in range(c)]
    width = max(len(x) for x in ids)
    pad = model.config.eos_token_id or 0
    inp = torch.tensor([[pad] * (width - len(x)) + x for x in ids], device=device)
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids], device=device)
    kw = dict(attention_mask=mask, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False,
              pad_token_id=pad)

    def no_sync() -> None:
        pass

    sync = torch.cuda.synchronize if str(device).startswith("cuda") else no_sync
    with torch.inference_mode():
        model.generate(inp, **{**kw, "max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
        sync()
        t0 = time.perf_counter()
        out = model.generate(inp, **kw)
        sync()
        dt = time.perf_counter() - t0
    new_tokens: int = out.shape[1] - width  # (out: (c, width + new tokens))
    return new_tokens * c / dt


def main(url: str, levels: list[int], max_tokens: int, rounds: int, model: str | None, api_key: str | None,
         json_path: str | None, plot_path: str | None, hf: bool, hf_only: bool = False, hf_device: str = "cpu",
         hf_dtype: str = "float32", hf_threads: int = 0, shared_prefix: int = 0, prompt_tokens: int = 0) -> int:
    import asyncio

    urls = [] if hf_only else [u.strip() for u in url.split(",") if u.strip()]
    clients = [Client(u, api_key) for u in urls]
    if len({c.engine for c in clients}) < len(clients):  # two servers of one engine: tell them apart
        for c in clients:
            c.engine = f"{c.engine}@{c.port}"
    results: list[Level] = []
    for client in clients:
        if shared_prefix:
            client.prefix = client.shared_prefix(shared_prefix)
        client.prompt_tokens = prompt_tokens
        asyncio.run(client.stream(prompt(10_000), 4))  # warm-up (no prefix: nothing for the levels to reuse)
        results += [run_level(client, c, rounds, max_tokens) for c in levels]
    hf_rate: dict[int, float] = {}
    if hf or hf_only:
        hf_rate = {c: hf_tok_s(model, c, max_tokens, hf_device, hf_dtype, hf_threads) for c in levels}
        for lv in results:
            lv.hf_tok_s = hf_rate[lv.concurrency]
            lv.ratio_vs_hf = lv.tok_s / lv.hf_tok_s
    if hf_only:
        print(f"HF transformers batched generate ({hf_device}, {hf_dtype}), {max_tokens} new tokens a prompt")
        for conc, r in hf_rate.items():
            print(f"  batch {conc:4d}: {r:9.1f} tok/s")
        report: dict[str, Any] = {
                  "date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": platform.platform(),
                  "model": model, "max_tokens": max_tokens, "hf_device": hf_device, "hf_dtype": hf_dtype,
                  "hf_threads": hf_threads,
                  "hf_tok_s": {str(c): r for c, r in hf_rate.items()}}
        if json_path:
            with open(json_path, "w") as f:
                json.dump(report, f, indent=2)
        return 0
    width = max(6, *(len(lv.engine) for lv in results))
    print(f"{'engine':>{width}} {'conc':>5} {'reqs':>5} {'tok/s':>9} {'TTFT p50':>9} {'p99':>8} {'ITL p50':>8} "
          f"{'p99':>8}" + (f" {'HF tok/s':>9} {'ratio':>6}" if hf else ""))
    for lv in results:
        print(f"{lv.engine:>{width}} {lv.concurrency:5d} {lv.requests:5d} {lv.tok_s:9.1f} {lv.ttft_p50_ms:7.1f}ms "
              f"{lv.ttft_p99_ms:6.1f}ms {lv.itl_p50_ms:6.1f}ms {lv.itl_p99_ms:6.1f}ms"
              + (f" {lv.hf_tok_s:9.1f} {lv.ratio_vs_hf:6.2f}" if lv.hf_tok_s else ""))
    report = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": platform.platform(),
              "processor": platform.processor(), "url": url, "model": clients[0].model, "max_tokens": max_tokens,
              "rounds": rounds, "shared_prefix": shared_prefix, "prompt_tokens": prompt_tokens,
              "levels": [asdict(lv) for lv in results],
              **({"hf_device": hf_device, "hf_dtype": hf_dtype, "hf_threads": hf_threads} if hf else {})}
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=2)
    if plot_path:
        plot(results, plot_path)
    return 0


def plot(results: list[Level], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise WebtensorError("--plot needs matplotlib (pip install 'webtensor[bench]')") from e
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    engines = list(dict.fromkeys(lv.engine for lv in results))
    for eng in engines:
        rows = [lv for lv in results if lv.engine == eng]
        cs = [lv.concurrency for lv in rows]
        label = f"webtensor serve ({eng})"
        a.plot(cs, [lv.tok_s for lv in rows], "o-", label=label)
        b.plot(cs, [lv.itl_p50_ms for lv in rows], "o-", label=f"inter-token p50, {eng}")
        b.plot(cs, [lv.itl_p99_ms for lv in rows], "o--", label=f"inter-token p99, {eng}")
        b.plot(cs, [lv.ttft_p50_ms for lv in rows], "s-", label=f"TTFT p50, {eng}")
    first = [lv for lv in results if lv.engine == engines[0]]
    if all(lv.hf_tok_s for lv in first):
        a.plot([lv.concurrency for lv in first], [lv.hf_tok_s for lv in first], "s--", label="HF batched generate")
    a.set(xlabel="concurrency", ylabel="aggregate tokens/s", xscale="log")
    a.legend()
    b.set(xlabel="concurrency", ylabel="ms", xscale="log", yscale="log")
    b.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
