"""The server's Prometheus metrics, in a registry of its own (GET /metrics renders it)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["CONTENT_TYPE", "Metrics"]

_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_BATCH = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("webtensor_requests", "HTTP requests by route and status", ["route", "status"],
                                registry=r)
        self.prompt_tokens = Counter("webtensor_prompt_tokens", "Prompt tokens admitted", registry=r)
        self.generated_tokens = Counter("webtensor_generated_tokens", "Tokens generated", registry=r)
        self.queue_depth = Gauge("webtensor_queue_depth", "Requests waiting for a slot", registry=r)
        self.active = Gauge("webtensor_active_sequences", "Sequences holding a slot", registry=r)
        self.batch_size = Histogram("webtensor_batch_size", "Rows per engine step", buckets=_BATCH, registry=r)
        self.step_seconds = Histogram("webtensor_step_seconds", "Engine step duration", buckets=_LATENCY,
                                      registry=r)
        self.ttft = Histogram("webtensor_time_to_first_token_seconds", "Arrival to first token",
                              buckets=_LATENCY, registry=r)
        self.inter_token = Histogram("webtensor_inter_token_latency_seconds", "Between a sequence's tokens",
                                     buckets=_LATENCY, registry=r)
        self.step_failures = Counter("webtensor_step_failures", "Engine steps that raised", registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
