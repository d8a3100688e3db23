"""`webtensor serve`: an OpenAI-compatible HTTP server with continuous batching on one device.

Modules, one concern each: `protocol` (request / response shapes and OpenAI error bodies),
`engine` (the `Engine` protocol the scheduler drives and `ModelEngine`, over a model's runner), `textstream`
(decoded text with stop sequences), `scheduler` (continuous batching on one device), `metrics`
(Prometheus), `grammar` (llguidance: structured output's token masks), `conversation` (a chat's prompt with
its tools and history, and how its answer is read), `tools` (tool-call formats: parsers and forced-call
grammars), `reply` (an answer's reasoning, text and calls, whole or as deltas), `responses` (the Responses
API's output items and events), `openapi` (the server's own OpenAPI document), `app` (the FastAPI routes),
`cli` (`webtensor serve` / `webtensor bench-serve`), `process` (the engine in its own process) and `bench`
(the load generator).
"""
