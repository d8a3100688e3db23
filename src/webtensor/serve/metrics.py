"""The server's Prometheus metrics, in a registry of its own (GET /metrics renders it).

Names follow vLLM's (`vllm:NAME` there, `webtensor:NAME` here) wherever vLLM has a counterpart, so a
dashboard or scraper written for vLLM reads this server by changing the prefix:

| here                                      | what                                                    |
|-------------------------------------------|---------------------------------------------------------|
| webtensor:num_requests_running            | sequences holding a slot (gauge)                        |
| webtensor:num_requests_waiting            | requests queued for a slot (gauge)                      |
| webtensor:prompt_tokens_total             | prompt tokens admitted (counter)                        |
| webtensor:generation_tokens_total         | tokens generated and streamed (counter)                 |
| webtensor:request_success_total           | requests ended, by finished_reason (*)                  |
| webtensor:request_prompt_tokens           | prompt tokens per request (histogram)                   |
| webtensor:request_generation_tokens       | generated tokens per finished request (histogram)       |
| webtensor:iteration_tokens_total          | tokens fed per engine step, prompt and decode (histogram) |
| webtensor:time_to_first_token_seconds     | arrival to the first token (histogram)                  |
| webtensor:inter_token_latency_seconds     | between a sequence's tokens (histogram)                 |
| webtensor:e2e_request_latency_seconds     | arrival to the last token (histogram)                   |
| webtensor:request_queue_time_seconds      | arrival to a slot (histogram)                           |
| webtensor:prefix_cache_queries_total      | prompt tokens looked up in the prefix cache (counter)   |
| webtensor:prefix_cache_hits_total         | of those, tokens found there and not computed again     |
| webtensor:kv_cache_usage_perc             | share of the KV pool's blocks held by sequences (gauge) |
| webtensor:num_preemptions_total           | sequences taken off the device for KV memory (counter)  |

(*) stop, length, abort (the client went away) or error.

And webtensor's own: `webtensor:http_requests_total{route,status}`, `webtensor:step_rows` (rows per
engine step), `webtensor:step_duration_seconds`, `webtensor:step_failures_total` (engine steps that
raised), `webtensor:row_failures_total` (rows whose sampling raised, failing their request alone) and
`webtensor:kv_blocks{state}` (the KV pool's blocks: `used` by sequences, `cached` for the prefix cache
and reusable, `free`).
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["CONTENT_TYPE", "Metrics"]

_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_REQUEST = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0)
_BATCH = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)

P = "webtensor:"


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(P + "http_requests", "HTTP requests by route and status", ["route", "status"],
                                registry=r)
        self.active = Gauge(P + "num_requests_running", "Sequences holding a slot", registry=r)
        self.queue_depth = Gauge(P + "num_requests_waiting", "Requests waiting for a slot", registry=r)
        self.prompt_tokens = Counter(P + "prompt_tokens", "Prompt tokens admitted", registry=r)
        self.generated_tokens = Counter(P + "generation_tokens", "Tokens generated", registry=r)
        self.finished = Counter(P + "request_success", "Requests ended, by finish reason", ["finished_reason"],
                                registry=r)
        self.request_prompt = Histogram(P + "request_prompt_tokens", "Prompt tokens per request", buckets=_TOKENS,
                                        registry=r)
        self.request_generation = Histogram(P + "request_generation_tokens", "Generated tokens per request",
                                            buckets=_TOKENS, registry=r)
        self.step_tokens = Histogram(P + "iteration_tokens_total", "Tokens fed per engine step", buckets=_TOKENS,
                                     registry=r)
        self.ttft = Histogram(P + "time_to_first_token_seconds", "Arrival to first token", buckets=_LATENCY,
                              registry=r)
        self.inter_token = Histogram(P + "inter_token_latency_seconds", "Between a sequence's tokens",
                                     buckets=_LATENCY, registry=r)
        self.e2e = Histogram(P + "e2e_request_latency_seconds", "Arrival to the last token", buckets=_REQUEST,
                             registry=r)
        self.queue_time = Histogram(P + "request_queue_time_seconds", "Arrival to a slot", buckets=_REQUEST,
                                    registry=r)
        self.batch_size = Histogram(P + "step_rows", "Rows per engine step", buckets=_BATCH, registry=r)
        self.step_seconds = Histogram(P + "step_duration_seconds", "Engine step duration", buckets=_LATENCY,
                                      registry=r)
        self.prefix_queries = Counter(P + "prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                                      registry=r)
        self.prefix_hits = Counter(P + "prefix_cache_hits", "Prompt tokens found in the prefix cache (reused)",
                                   registry=r)
        self.kv_usage = Gauge(P + "kv_cache_usage_perc", "Share of the KV pool's blocks held by sequences",
                              registry=r)
        self.kv_blocks = Gauge(P + "kv_blocks", "KV pool blocks: used, cached (reusable), free", ["state"],
                               registry=r)
        self.preemptions = Counter(P + "num_preemptions", "Sequences preempted for KV memory (recomputed later)",
                                   registry=r)
        self.step_failures = Counter(P + "step_failures", "Engine steps that raised", registry=r)
        self.row_failures = Counter(P + "row_failures", "Rows whose sampling raised (their request failed alone)",
                                    registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
