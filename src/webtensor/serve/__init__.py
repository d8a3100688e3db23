"""`webtensor serve`: an OpenAI-compatible HTTP server with continuous batching on one device.

Modules, one concern each: `protocol` (request / response shapes and OpenAI error bodies),
`engine` (the `Engine` protocol the scheduler drives and `ModelEngine`, over a model's runner), `textstream`
(decoded text with stop sequences), `scheduler` (continuous batching on one device), `metrics`
(Prometheus), `app` (the FastAPI routes), `cli` (`webtensor serve` / `webtensor bench-serve`) and
`bench` (the load generator).
"""
