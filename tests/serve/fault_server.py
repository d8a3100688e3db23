"""A test server: the shipped model's reference engine behind a wrapper that slows every step down (so tests
can catch requests mid-flight) and raises a GPUError in any step that feeds the FAULT token ids.
Run as a script: python fault_server.py PORT DELAY_S MAX_BATCH MAX_QUEUE [API_KEY|-] [GRACE_S]."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from webtensor.device import Device
from webtensor.errors import GPUError
from webtensor.models.gpt2.model import GPT2
from webtensor.serve.engine import ModelEngine, Row
from webtensor.serve.server import serve

FAULT = (4095, 4094, 4093)  # a prompt starting with these ids makes its step fail


class SlowFaultyEngine:
    def __init__(self, inner: ModelEngine, delay: float):
        self.inner, self.delay = inner, delay
        self.name, self.max_batch, self.n_ctx = inner.name, inner.max_batch, inner.n_ctx
        self.vocab_size, self.eos_ids, self.bos_id = inner.vocab_size, inner.eos_ids, inner.bos_id
        self.tokenizer, self.chat_template = inner.tokenizer, inner.chat_template

    def step(self, rows: Sequence[Row]) -> list[int | None]:
        time.sleep(self.delay)
        if any(r.ids[:3] == FAULT for r in rows):
            raise GPUError("injected fault: the device was lost")
        return self.inner.step(rows)

    def release(self, slot: int) -> None:
        self.inner.release(slot)


if __name__ == "__main__":
    port, delay, max_batch, max_queue = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    key = sys.argv[5] if len(sys.argv) > 5 and sys.argv[5] != "-" else None
    grace = float(sys.argv[6]) if len(sys.argv) > 6 else 10.0
    model = GPT2.from_pretrained(None, device=Device.cpu())
    engine = SlowFaultyEngine(ModelEngine(model, max_batch, name="webtensor-shipped", engine="reference"), delay)
    serve(engine, "127.0.0.1", port, max_queue, key, grace=grace)
