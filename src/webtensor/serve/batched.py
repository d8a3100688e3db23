"""`BatchedGPT2Engine`: every single-token row of a step (the running sequences' decode tokens) in
one forward over B rows, the weights read once per step (on WebGPU once per 8 rows, inside each
product's one launch), instead of once per row as `GPT2Engine` does. Prompt chunks (rows of more
than one token) run through the span path, as in the reference engine, in the same dispatch scope.

Batch invariance is exact: each row's logits are bit for bit what the reference engine computes
for it alone, on the CPU and on WebGPU, in float32 and float16. Two things keep it so:

- on the CPU the forward holds a batch's activations as (B, 1, C) (`models.gpt2.forward`): numpy's
  matmul of a stack of one-row matrices calls the same BLAS matrix-vector product for each row that
  a lone row gets, while a (B, C) operand would go to the matrix-matrix kernel, whose rows differ
  from the lone row's in the last bits; the Python cost is still paid once per step;
- on WebGPU the same layout makes every product a stack of one-row products, which the planner
  runs as one GEMV launch over all B rows (gemv.wgsl / gemv_q8.wgsl, 8 rows a workgroup, each
  row's sum in the order of a one-row launch: `backends.wgpu.ops.gemv_group`), where a (B, C)
  product would go to the tiled kernels (matmul_regs.wgsl on CPU adapters, matmul_engine.wgsl on
  GPUs), which sum in another order; every other op of the step is row by row already.

Each step width's decode step is captured as a graph (built on first use, each with its own state
tensors) and replayed: on WebGPU its launches, on the CPU its plan of numpy steps (no validation,
Tensors or views a step: `backends.cpu.CpuGraph`). `group` can split the rows into several
forwards (graphs) of at most that many rows; the default is one of up to `max_batch`.

The one-token rows run through the model's forward without a span (one sequence a row); the
reference engine's one-token rows take the same path with B = 1 (`GPT2Engine`), which is what
`GPT2.generate`'s decode steps run too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import ops
from ..errors import ArgumentError, ContextLengthError
from ..generation import DecodeState, int_tensor, prefill, upload_ints
from ..models.gpt2.model import GPT2
from ..models.gpt2.validate import check_ids
from ..tensor import Tensor
from .engine import GPT2EngineBase, Row, choose, is_decode_row


class _Group:
    """One group's captured decode step over its own state tensors."""

    def __init__(self, model: GPT2, cache: Any, rows: int):
        self.state = DecodeState(model.device, rows, 1)
        s = self.state

        def step() -> tuple[Tensor, Tensor]:
            logits = model.forward(s.ids, s.pos, s.slot, cache, None, False)
            return logits, ops.argmax(logits)
        self.graph = model.device.capture(step)

    def release(self) -> None:
        self.graph.release()


class BatchedGPT2Engine(GPT2EngineBase):
    """The batched engine: one KV cache of `max_batch` slots; each step's one-token rows run as one
    forward, prompt chunks through the span path."""

    engine = "batched"

    def __init__(self, model: GPT2, max_batch: int, name: str | None = None, use_graph: bool | None = None,
                 group: int | None = None):
        super().__init__(model, max_batch, name)
        self.use_graph = model.use_graph if use_graph is None else use_graph
        self.group = group or max_batch
        if self.group < 1:
            raise ArgumentError(f"group must be >= 1, got {group}")
        self.cache = model.new_cache(max_batch)
        self._length = [0] * max_batch  # tokens held per slot
        self._graphs: dict[tuple[int, int], _Group] = {}

    # -- the protocol ---------------------------------------------------------------------------
    def release(self, slot: int) -> None:
        self._check_slot(slot)
        self._length[slot] = 0

    def step(self, rows: Sequence[Row]) -> list[int | None]:
        self._check(rows)
        dev = self.model.device
        decode = [i for i, r in enumerate(rows) if is_decode_row(r)]
        chunks = [i for i, r in enumerate(rows) if not is_decode_row(r)]
        groups = [decode[g:g + self.group] for g in range(0, len(decode), self.group)]
        if self.use_graph:  # state uploads before the scope: every group has its own tensors
            graphs = [self._graph(k, [rows[i] for i in idx]) for k, idx in enumerate(groups)]
        pending: list[tuple[list[int], Any, Any]] = []  # (row indices, argmax ticket, logits ticket or None)
        read = dev.backend.read_async
        with dev.dispatch_scope():
            for k, idx in enumerate(groups):
                group = [rows[i] for i in idx]
                if self.use_graph:
                    logits, best = graphs[k].graph.replay()
                else:
                    logits = self.model.forward(int_tensor([r.ids[0] for r in group], dev),
                                                int_tensor([r.start for r in group], dev),
                                                int_tensor([r.slot for r in group], dev), self.cache, None, False)
                    best = ops.argmax(logits)
                sampled = any(r.sample and r.sampling.temperature != 0 for r in group)
                pending.append((idx, read(best), (read(logits), logits) if sampled else None))
            for i in chunks:
                r = rows[i]
                logits = prefill(self.model, self.cache, r.ids, r.start, r.slot)  # (1, V)
                if r.sample:
                    sampled = r.sampling.temperature != 0
                    pending.append(([i], None if sampled else read(ops.argmax(logits)),
                                    (read(logits), logits) if sampled else None))
        out: list[int | None] = [None] * len(rows)
        for idx, best_t, logits_t in pending:
            best = np.frombuffer(bytes(best_t.wait()), np.int32) if best_t is not None else None
            rows_logits = None
            if logits_t is not None:
                ticket, t = logits_t
                rows_logits = np.frombuffer(bytes(ticket.wait()), t.dtype.name).reshape(-1, t.shape[-1])
            for j, i in enumerate(idx):
                r = rows[i]
                if not r.sample:
                    continue
                if r.sampling.temperature == 0:
                    out[i] = int(best[j])  # type: ignore[index]
                else:
                    out[i] = choose(rows_logits[j].astype(np.float32, copy=False), r.sampling,  # type: ignore[index]
                                    r.next_position)
        for r in rows:
            self._length[r.slot] = r.next_position
        return out

    # -- helpers --------------------------------------------------------------------------------
    def _graph(self, k: int, group: list[Row]) -> _Group:
        g = self._graphs.get((k, len(group)))
        if g is None:
            g = self._graphs[(k, len(group))] = _Group(self.model, self.cache, len(group))
        s = g.state
        upload_ints(s.ids, [r.ids[0] for r in group])
        upload_ints(s.pos, [r.start for r in group])
        upload_ints(s.slot, [r.slot for r in group])
        return g

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.max_batch:
            raise ArgumentError(f"slot {slot} is out of range for {self.max_batch} slots")

    def _check(self, rows: Sequence[Row]) -> None:
        """Every row checked before any runs: a bad one fails the step with nothing written."""
        seen: set[int] = set()
        for r in rows:
            self._check_slot(r.slot)
            if r.slot in seen:
                raise ArgumentError(f"slot {r.slot} has two rows in one step")
            seen.add(r.slot)
            if not r.ids:
                raise ArgumentError(f"the row for slot {r.slot} has no tokens")
            if r.start != 0 and self._length[r.slot] != r.start:
                raise ArgumentError(f"slot {r.slot} holds {self._length[r.slot]} tokens, the row starts at {r.start}")
            check_ids(r.ids, self.vocab_size)
            if r.start + len(r.ids) > self.n_ctx:
                raise ContextLengthError(f"{r.start} cached + {len(r.ids)} new tokens exceed the context of "
                                         f"{self.n_ctx} positions")

    def close(self) -> None:
        """Free the captured graphs."""
        for g in self._graphs.values():
            g.release()
        self._graphs.clear()
