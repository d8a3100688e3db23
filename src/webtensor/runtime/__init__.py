"""The model-generic runtime: a step's rows (`batch.StepBatch`), the KV cache (`cache.KVCache`), the model runner
that owns a model's slots, captured step graphs and feed-back ring (`runner.ModelRunner`), and the decode loops
built on it (`generate`). Nothing here names a model family; importable without numpy (the page)."""
