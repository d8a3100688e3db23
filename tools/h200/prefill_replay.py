"""The prompt pass as replayed graphs, measured (issue 28 item 3; run by tools/h200/prefill_replay.sh).

`wall`: for one model (a preset of random weights, or `llama-3.1-8b` cut to --layers of its 32), the wall time of
`ModelRunner.prefill` (logits read back) against its GPU time (the replayed chunk graphs' dispatches, each timed by
timestamp queries: `profiler.profile_prefill`), the replay submitted as one batch ("whole": KernelPolicy.submit_first
0, no early pieces) and the same prompt run eagerly (the same chunks' forwards planned op by op: the host cost the
replay removes), at each prompt length; one JSON line per length on stdout and a table.

`itl`: against a running `webtensor serve`, `--streams` greedy streams decoding; once they are steady, the inter-event
gaps of their streams (what a client sees between SSE events) in a window before, then while a `--long`-token
prompt is read (from its request until its first token), `--rounds` times; p50 / p99 of each window, the long
prompt's time to first token. One JSON line and a table row.

    python tools/h200/prefill_replay.py wall --model smollm2-135m [--prompts 128,1024,4096] [--layers N] [--tiny]
    python tools/h200/prefill_replay.py itl --url http://127.0.0.1:8177 [--streams 63] [--long 4096]
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import threading
import time
import urllib.parse
import urllib.request
from typing import Any

# Llama-3.1-8B's config.json, abridged to what shapes the computation (the 8B-shaped rows of issue 28)
LLAMA_8B = {"model_type": "llama", "hidden_act": "silu", "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
            "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "max_position_embeddings": 131072, "rope_theta": 500000.0,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192},
            "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]}


def build(name: str, layers: int | None, dtype: str, n_ctx: int, tiny: bool) -> Any:
    import webtensor as wt
    from webtensor.models import loader, registry

    if name == "llama-3.1-8b":
        family, raw = registry.by_name("llama"), dict(LLAMA_8B)
    else:
        found = registry.preset(name)
        if found is None:
            raise SystemExit(f"--model {name!r}: not a preset ({', '.join(registry.presets())}) or llama-3.1-8b")
        family, _, raw = found
    if layers:
        raw[("n_layer" if "n_layer" in raw else "num_hidden_layers")] = layers
    if tiny:  # a quick trial: the widths cut down, the structure kept
        raw.update({"hidden_size": 144, "intermediate_size": 96, "vocab_size": 512, "num_attention_heads": 9,
                    "num_key_value_heads": 3} if family.name == "llama" else {"n_embd": 128, "vocab_size": 512})
        raw.update(bos_token_id=0, eos_token_id=0)
        raw.pop("head_dim", None)
    dev = wt.Device.wgpu()
    if tiny:
        dev.kernel_policy = dev.kernel_policy.replace(gpu_style=True)
    cfg = family.config_from_hf(raw, name)
    return loader.random(family.name, cfg, device=dev, dtype=dtype, n_ctx=n_ctx)


def wall(a: argparse.Namespace) -> None:
    from webtensor.backends.wgpu.profiler import keep_busy, profile_prefill

    prompts = [int(x) for x in a.prompts.split(",")]
    t0 = time.perf_counter()
    m = build(a.model, a.layers, a.dtype, max(prompts) + 8, a.tiny)
    dev = m.device
    print(f"# {a.model}{f' ({a.layers} layers)' if a.layers else ''} {a.dtype} on {dev.describe()}: built in "
          f"{time.perf_counter() - t0:.0f} s, {m.weight_bytes / 2**30:.2f} GiB of weights", flush=True)
    rows = []
    for T in prompts:
        ids = [(7 * i + 3) % m.vocab_size for i in range(T)]
        res: dict[str, Any] = {"model": a.model, "layers": a.layers, "dtype": a.dtype, "tokens": T}
        policy = dev.kernel_policy
        for kind, use_graph in (("replay", True), ("whole", True), ("eager", False)):
            # whole: the replay submitted as one batch (no early pieces: KernelPolicy.submit_first 0)
            dev.kernel_policy = policy.replace(submit_first=0) if kind == "whole" else policy
            runner = m.runner(1, use_graph=use_graph, bucketed=False)
            runner.prefill(0, ids).numpy()  # (graphs captured, kernels compiled)
            times = []
            for _ in range(a.repeats):
                keep_busy(dev)
                t1 = time.perf_counter()
                runner.prefill(0, ids).numpy()
                times.append(time.perf_counter() - t1)
            res[f"{kind}_ms"] = round(statistics.median(times) * 1e3, 2)
            res[f"{kind}_ms_min"] = round(min(times) * 1e3, 2)
            res["chunks"] = len(runner.chunks(0, T))
            runner.close()
        dev.kernel_policy = policy
        keep_busy(dev)
        prof = profile_prefill(m, T)
        res["gpu_ms"] = round(prof["total_us"] / 1e3, 2)
        res["dispatches"] = prof["dispatches"]
        res["top_kernels"] = [(k, round(us / 1e3, 2)) for k, us in prof["kernels"][:5]]
        res["replay_over_gpu"] = round(res["replay_ms"] / res["gpu_ms"], 3)
        res["eager_over_gpu"] = round(res["eager_ms"] / res["gpu_ms"], 3)
        res["whole_over_gpu"] = round(res["whole_ms"] / res["gpu_ms"], 3)
        res["replay_tok_s"] = round(T / res["replay_ms"] * 1e3)
        print(json.dumps(res), flush=True)
        rows.append(res)
    print(HEADER)
    for r in rows:
        print(f"{a.model[:14]:>14} {r['tokens']:>6} {r['chunks']:>6} {r['dispatches']:>5} {r['gpu_ms']:>8.2f} "
              f"{r['replay_ms']:>9.2f} {r['replay_over_gpu']:>6.2f} {r['whole_over_gpu']:>6.2f} {r['eager_ms']:>9.2f} "
              f"{r['eager_over_gpu']:>6.2f} {r['replay_tok_s']:>8}")


HEADER = (f"{'model':>14} {'tokens':>6} {'chunks':>6} {'disp':>5} {'GPU ms':>8} {'replay ms':>9} {'ratio':>6} "
          f"{'whole':>6} {'eager ms':>9} {'ratio':>6} {'tok/s':>8}")


class Stream(threading.Thread):
    """Streamed completions, one after another until `stop`: the arrival times of each one's SSE events (an event:
    one or more tokens)."""

    def __init__(self, url: str, model: str, prompt: list[int], max_tokens: int, again: bool = True):
        super().__init__(daemon=True)
        self.url, self.model, self.prompt, self.max_tokens, self.again = url, model, prompt, max_tokens, again
        self.requests: list[list[float]] = []  # per completion, its events' times
        self.sent = 0.0  # (the first completion's)
        self.error: str | None = None
        self.stop = False

    @property
    def events(self) -> list[float]:
        return [t for r in self.requests for t in r]

    def run(self) -> None:
        while not self.stop:
            self._one()
            if not self.again or self.error:
                return

    def _one(self) -> None:
        u = urllib.parse.urlparse(self.url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
        body = json.dumps({"model": self.model, "prompt": self.prompt, "max_tokens": self.max_tokens,
                           "temperature": 0, "ignore_eos": True, "stream": True})
        times: list[float] = []
        self.requests.append(times)
        try:
            if len(self.requests) == 1:
                self.sent = time.perf_counter()
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                self.error = f"HTTP {resp.status}: {resp.read()[:200]!r}"
                return
            while not self.stop:
                line = resp.readline()
                if not line:
                    return
                if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                    times.append(time.perf_counter())
        except OSError as e:
            self.error = f"{type(e).__name__}: {e}"
        finally:
            conn.close()


def gaps(streams: list[Stream], lo: float, hi: float) -> list[float]:
    """Every stream's gaps between consecutive events of one completion that end within [lo, hi], in ms."""
    out = []
    for s in streams:
        for ev in list(s.requests):
            out += [(b - a) * 1e3 for a, b in zip(ev, ev[1:], strict=False) if lo <= b <= hi]
    return out


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def itl(a: argparse.Namespace) -> None:
    models = json.loads(urllib.request.urlopen(a.url + "/v1/models").read())
    model = models["data"][0]["id"]
    health = json.loads(urllib.request.urlopen(a.url + "/health").read())
    vocab = a.vocab
    streams = [Stream(a.url, model, [(31 * i + 7 * j) % vocab for j in range(16)], a.tokens)
               for i in range(a.streams)]
    for s in streams:
        s.start()
    t_start = time.perf_counter()
    while min(len(s.events) for s in streams) < 20:  # every stream decoding, graphs captured
        if time.perf_counter() - t_start > 120 or any(s.error for s in streams):
            raise SystemExit(f"streams did not start: {[s.error for s in streams if s.error][:3]}")
        time.sleep(0.1)
    time.sleep(1.0)
    before, during, ttft = [], [], []
    for r in range(a.rounds):
        t0 = time.perf_counter()
        time.sleep(a.window)
        t1 = time.perf_counter()
        before += gaps(streams, t0, t1)
        long = Stream(a.url, model, [(13 * j + 5 * r + 1) % vocab for j in range(a.long)], 1, again=False)
        long.start()
        long.join(300)
        if long.error or not long.events:
            raise SystemExit(f"the long prompt failed: {long.error}")
        ttft.append((long.events[0] - long.sent) * 1e3)
        during += gaps(streams, long.sent, long.events[0])
        time.sleep(0.5)
    for s in streams:
        s.stop = True
    errors = [s.error for s in streams if s.error]
    res = {"url": a.url, "streams": a.streams, "long": a.long, "rounds": a.rounds, "label": a.label,
           "health": {k: health.get(k) for k in ("engine", "max_batch", "prefill_chunk", "prefill_budget")},
           "before_p50_ms": round(pct(before, 0.5), 2), "before_p99_ms": round(pct(before, 0.99), 2),
           "during_p50_ms": round(pct(during, 0.5), 2), "during_p99_ms": round(pct(during, 0.99), 2),
           "during_max_ms": round(max(during, default=float("nan")), 2), "gaps_before": len(before),
           "gaps_during": len(during), "long_ttft_ms": [round(x, 1) for x in ttft], "errors": errors[:3]}
    print(json.dumps(res), flush=True)
    print(f"{a.label:>22} {a.streams:>7} {a.long:>6} {res['before_p50_ms']:>8.1f} {res['before_p99_ms']:>8.1f} "
          f"{res['during_p50_ms']:>8.1f} {res['during_p99_ms']:>8.1f} {statistics.median(ttft):>9.0f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("wall")
    w.add_argument("--model", default="smollm2-135m")
    w.add_argument("--layers", type=int, default=None)
    w.add_argument("--dtype", default="float16")
    w.add_argument("--prompts", default="128,1024,4096")
    w.add_argument("--repeats", type=int, default=3)
    w.add_argument("--tiny", action="store_true", help="cut widths, GPU kernels on a CPU adapter (a local trial)")
    i = sub.add_parser("itl")
    i.add_argument("--url", default="http://127.0.0.1:8177")
    i.add_argument("--streams", type=int, default=63)
    i.add_argument("--long", type=int, default=4096)
    i.add_argument("--tokens", type=int, default=4000, help="max_tokens of each decoding stream")
    i.add_argument("--rounds", type=int, default=3)
    i.add_argument("--window", type=float, default=3.0, help="seconds of the window before each long prompt")
    i.add_argument("--vocab", type=int, default=49152, help="token ids below this")
    i.add_argument("--label", default="")
    a = p.parse_args()
    wall(a) if a.cmd == "wall" else itl(a)


if __name__ == "__main__":
    main()
