"""`webtensor bench-serve`: a bounded load generator for a running server.

At each concurrency level C, C clients each send `rounds` streamed /v1/completions requests (greedy,
`max_tokens` tokens each, `ignore_eos` so every request makes all of them), one after another, so
at most C are in flight. Reported per level: aggregate tokens/s (all tokens over the wall time),
time to first token p50/p99 and inter-token latency p50/p99 (gaps between a stream's token events).
With `--hf`, HF transformers' batched `generate` of the same C prompts (greedy, exactly max_tokens
new tokens, left-padded) is timed in the same run, after the server's levels, for the ratio.
Several servers (comma-separated URLs, e.g. the batched and the reference engine on two ports) are
measured one after another in the same run, each row labelled with the engine its /health names.
"""

from __future__ import annotations

import http.client
import json
import platform
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from urllib.parse import urlsplit

import numpy as np

from ..errors import WebtensorError

TOPICS = ["The weather", "A short story about a cat", "In the year 2050", "The best way to cook rice",
          "Once upon a time", "The history of the bicycle", "My favourite song", "How computers work"]


def prompt(i: int) -> str:
    """The i-th benchmark prompt: different texts and lengths."""
    return f"{TOPICS[i % len(TOPICS)]}{', part ' + str(i) if i >= len(TOPICS) else ''}" + " and" * (i % 5) + ":"


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
    def __init__(self, url: str, api_key: str | None, model: str | None = None):
        u = urlsplit(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.model = model or self._model()
        self.engine = self._engine()

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
        return body["data"][0]["id"]

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

    def stream(self, text: str, max_tokens: int) -> Stream:
        """One streamed completion; its token count, TTFT and inter-token gaps."""
        body = {"model": self.model, "prompt": text, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "ignore_eos": True, "stream_options": {"include_usage": True}}
        c = self._conn()
        t0 = time.perf_counter()
        try:
            c.request("POST", "/v1/completions", body=json.dumps(body), headers=self.headers)
            r = c.getresponse()
            if r.status != 200:
                raise WebtensorError(f"POST /v1/completions: HTTP {r.status}: {r.read()[:300]!r}")
            out, last = Stream(), None
            for line in r:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                msg = json.loads(line[6:])
                if "error" in msg:
                    raise WebtensorError(f"stream error: {msg['error'].get('message')}")
                if not msg.get("choices"):
                    continue
                now = time.perf_counter()
                if last is None:
                    out.ttft = now - t0
                else:
                    out.gaps.append(now - last)
                last = now
                out.tokens += 1
            return out
        finally:
            c.close()


def run_level(client: Client, c: int, rounds: int, max_tokens: int) -> Level:
    from tqdm.auto import tqdm

    streams: list[Stream] = []
    with tqdm(total=c * rounds, desc=f"concurrency {c}", unit="req", leave=False) as bar:
        def one_client(k: int) -> None:
            for r in range(rounds):
                streams.append(client.stream(prompt(k + r * c), max_tokens))
                bar.update(1)

        t0 = time.perf_counter()
        with ThreadPoolExecutor(c) as pool:
            list(pool.map(one_client, range(c)))
        wall = time.perf_counter() - t0
    tokens = sum(s.tokens for s in streams)
    ttft = np.array([s.ttft for s in streams]) * 1e3
    gaps = np.array([g for s in streams for g in s.gaps] or [0.0]) * 1e3
    return Level(client.engine, c, len(streams), tokens, wall, tokens / wall, float(np.percentile(ttft, 50)),
                 float(np.percentile(ttft, 99)), float(np.percentile(gaps, 50)), float(np.percentile(gaps, 99)))


def hf_tok_s(model_spec: str | None, c: int, max_tokens: int) -> float:
    """HF transformers' batched greedy generate of the level's first C prompts: new tokens per second."""
    import torch
    from transformers import GPT2LMHeadModel

    from ..models.gpt2.tokenizer import GPT2Tokenizer
    from ..models.gpt2.weights import resolve

    d = resolve(model_spec)
    model = GPT2LMHeadModel.from_pretrained(str(d)).eval()
    tok = GPT2Tokenizer.from_dir(d)
    ids = [tok.encode(prompt(k)) for k in range(c)]
    width = max(len(x) for x in ids)
    pad = model.config.eos_token_id or 0
    inp = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
    kw = dict(attention_mask=mask, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False,
              pad_token_id=pad)
    with torch.inference_mode():
        model.generate(inp, **{**kw, "max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
        t0 = time.perf_counter()
        out = model.generate(inp, **kw)
        dt = time.perf_counter() - t0
    return (out.shape[1] - width) * c / dt


def main(url: str, levels: list[int], max_tokens: int, rounds: int, model: str | None, api_key: str | None,
         json_path: str | None, plot_path: str | None, hf: bool) -> int:
    urls = [u.strip() for u in url.split(",") if u.strip()]
    clients = [Client(u, api_key) for u in urls]
    results: list[Level] = []
    for client in clients:
        client.stream(prompt(0), 4)  # warm-up
        results += [run_level(client, c, rounds, max_tokens) for c in levels]
    if hf:
        hf_rate = {c: hf_tok_s(model, c, max_tokens) for c in levels}
        for lv in results:
            lv.hf_tok_s = hf_rate[lv.concurrency]
            lv.ratio_vs_hf = lv.tok_s / lv.hf_tok_s
    width = max(6, *(len(lv.engine) for lv in results))
    print(f"{'engine':>{width}} {'conc':>5} {'reqs':>5} {'tok/s':>9} {'TTFT p50':>9} {'p99':>8} {'ITL p50':>8} "
          f"{'p99':>8}" + (f" {'HF tok/s':>9} {'ratio':>6}" if hf else ""))
    for lv in results:
        print(f"{lv.engine:>{width}} {lv.concurrency:5d} {lv.requests:5d} {lv.tok_s:9.1f} {lv.ttft_p50_ms:7.1f}ms "
              f"{lv.ttft_p99_ms:6.1f}ms {lv.itl_p50_ms:6.1f}ms {lv.itl_p99_ms:6.1f}ms"
              + (f" {lv.hf_tok_s:9.1f} {lv.ratio_vs_hf:6.2f}" if lv.hf_tok_s else ""))
    report = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": platform.platform(),
              "processor": platform.processor(), "url": url, "model": clients[0].model, "max_tokens": max_tokens,
              "rounds": rounds, "levels": [asdict(lv) for lv in results]}
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
