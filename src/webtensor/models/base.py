"""`LanguageModel`: a model of any family on a device, and what users call — `logits`, `generate`, `stream`,
`encode`, `decode`, `apply_chat_template`, `generate_batch`. It holds the family's config and weights (whose
`forward(batch, cache)` is the model), the tokenizer, the chat template and the runtime context; decoding goes
through `runtime` (a `ModelRunner` per concurrent generation, from a pool). Nothing here names a family.
Importable without numpy (the page): only `logits` needs it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

from ..errors import ArgumentError, ContextLengthError, SamplingError
from ..runtime.batch import StepBatch
from ..runtime.cache import BLOCK_SIZE, KVCache, check_kv_dtype, sequence_blocks
from ..runtime.generate import RunnerPool, generate, generate_batch
from ..runtime.runner import RING_STEPS, ModelRunner, RunRow, step_rows
from ..sampling import SamplingParams, SequenceState, check_max_new_tokens, sample, with_seed
from ..tensor import Tensor
from ..validate import check_ids, check_text, fit_context
from .spec import Family, ModelSpec


class LanguageModel:
    def __init__(self, family: Family, config: Any, weights: Any, device: Any, n_ctx: int, *, tokenizer: Any = None,
                 chat_template: str | None = None, eos_ids: frozenset[int] | None = None, dtype: str | None = None,
                 name: str = "model", weight_bytes: int = 0, params: dict[str, Any] | None = None,
                 kv_dtype: str | None = None):
        self.family, self.config, self.weights, self.device = family, config, weights, device
        self.params = params or {}  # the uploaded tensors by canonical (fused) name: `loader.export_arrays` reads them
        self.n_ctx = n_ctx  # the runtime context: positions per sequence (<= the trained context)
        self.tokenizer, self.chat_template, self.name = tokenizer, chat_template, name
        self.dtype = dtype  # the load dtype (None: as stored)
        self._more_eos = frozenset(eos_ids or ()) - config.spec.eos_ids  # (generation_config.json's)
        self.weight_bytes = weight_bytes  # bytes the weights take on the device (quantized: their blocks)
        self.use_graph = True  # replay captured decode steps (False: op by op, for comparison)
        self._runners = RunnerPool()
        self._kv_dtype = default_kv_dtype(device)
        if kv_dtype is not None:
            self.kv_dtype = kv_dtype

    @property
    def kv_dtype(self) -> str:
        """The KV cache's element type: "float32", "float16" (the default on devices whose kernels read float16) or
        "q8_0" (docs/design-kv.md). Setting it applies to the runners made after (the pooled ones are dropped)."""
        return self._kv_dtype

    @kv_dtype.setter
    def kv_dtype(self, value: str) -> None:
        self._kv_dtype = check_kv_dtype(value, self.spec.head_dim, self.device.has_f16)
        self._runners.clear()

    # -- what the runtime needs -------------------------------------------------------------------------
    @property
    def spec(self) -> ModelSpec:
        spec: ModelSpec = self.config.spec
        return spec

    @property
    def eos_ids(self) -> frozenset[int]:
        """Every id generation stops at: the config's and generation_config.json's."""
        return frozenset(self.spec.eos_ids | self._more_eos)

    @property
    def vocab_size(self) -> int:
        return self.spec.vocab_size

    def new_cache(self, n_seqs: int = 1, n_blocks: int | None = None, block_size: int = BLOCK_SIZE) -> KVCache:
        """A paged KV cache of `n_blocks` blocks of `block_size` positions (default: `n_seqs` whole contexts) and a
        block table of `n_seqs` sequences of up to the runtime context, in the model's `kv_dtype`."""
        s = self.spec
        max_blocks = -(-self.n_ctx // block_size)
        return KVCache(s.n_layer, s.n_kv_head, s.head_dim, self.device, n_seqs * max_blocks if n_blocks is None
                       else n_blocks, n_seqs, max_blocks, block_size, self.kv_dtype)

    def position_bytes(self) -> int:
        """Bytes one position of one sequence takes in the KV cache (keys and values, every layer)."""
        from ..runtime.cache import kv_position_bytes

        s = self.spec
        return kv_position_bytes(s.n_layer, s.n_kv_head, s.head_dim, self.kv_dtype)

    def forward(self, batch: StepBatch, cache: KVCache) -> Tensor:
        """The family's forward: the rows of `batch` -> logits (rows needing them, V). The rows' slots are rows of
        the cache's block table (a batch made without a table reads the cache's own)."""
        if batch.table is None:
            batch = dataclasses.replace(batch, table=cache.table)
        logits: Tensor = self.weights.forward(batch, cache)
        return logits

    def runner(self, n_slots: int, invariant: bool = True, use_graph: bool | None = None,
               bucketed: bool = True, weak: bool = False, kv_blocks: int | None = None,
               prefill_chunk: int | None = None) -> ModelRunner:
        """A new runner of `n_slots` sequences over a KV pool of `kv_blocks` blocks (default: every slot's whole
        context; the server's engines hold one: see `runtime.runner`)."""
        return ModelRunner(self, n_slots, use_graph=use_graph, invariant=invariant, bucketed=bucketed, weak=weak,
                           kv_blocks=kv_blocks, prefill_chunk=prefill_chunk)

    def describe(self, pool_positions: int | None = None) -> str:
        """One line: the model, its device, and its memory — the weights, the KV cache's type and bytes a position,
        and a pool of `pool_positions` positions (default: what `generate`'s runner holds: one sequence's context,
        or where every layer slides the blocks of its window and a step, `runtime.blocks.held_blocks`)."""
        s = self.spec
        n = pool_positions
        if n is None:
            n = self.n_ctx if s.kv_window is None else \
                min(self.n_ctx, sequence_blocks(self, step_rows(self.device)) * BLOCK_SIZE)
        line = memory_line(self.weight_bytes, self.dtype or 'as stored', self.kv_dtype, self.position_bytes(), n,
                           window=s.kv_window)
        return f"{self.name} ({s.architecture}, {s.n_layer} layers) on {self.device.describe()}: {line}"

    # -- forward -------------------------------------------------------------------------------------------
    def logits(self, ids: Sequence[int]) -> Any:
        """Full forward over `ids` (the prompt path: `ModelRunner`'s prompt chunks, the LM head on every row):
        logits (T, V) as float32 numpy."""
        import numpy as np

        ids = self._check_ids(ids)
        if len(ids) > self.n_ctx:
            raise ContextLengthError(f"{len(ids)} tokens exceed the context of {self.n_ctx}")
        runner = self._runners.acquire(1, lambda: self.runner(1, bucketed=False, weak=True))
        try:
            got = runner.collect(runner.launch([RunRow(0, tuple(ids), 0, pick=False, every_logits=True)]))
            return np.asarray(got.every_logits[0], np.float32)  # type: ignore[index]
        finally:
            self._runners.release(1, runner)

    # -- generation ----------------------------------------------------------------------------------------
    def generate_ids(self, ids: Sequence[int], max_new_tokens: int = 32, temperature: float = 0.0,
                     top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                     stop_at_eos: bool = True, truncate_prompt: bool = False, reuse_prefix: bool = False, *,
                     min_p: float = 0.0, presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                     repetition_penalty: float = 1.0, logit_bias: Any = (), min_tokens: int = 0,
                     stop_token_ids: Sequence[int] = (), follow_steps: int = RING_STEPS) -> Iterator[int]:
        """Yield new token ids one by one. Refuses a prompt that does not fit (ContextLengthError) unless
        `truncate_prompt`, which keeps the prompt's last tokens. The same seed gives the same tokens on every
        device (a token's draw depends on the seed and its position only), and as the server gives them.
        `reuse_prefix`: the prompt's first tokens still in the KV cache from the last call (a conversation's
        earlier turns) are not computed again (their logits then come from a prompt pass of another length:
        equal to float rounding). min_p, the penalties (presence / frequency over the generated tokens, HF's
        repetition_penalty over prompt and generated), logit_bias ({id: bias}), min_tokens (no EOS or
        stop_token_ids before) and stop_token_ids (ids that end generation besides EOS): see
        `webtensor.sampling`. `follow_steps` (1 to RING_STEPS): the most greedy steps one readback brings back
        (`runtime.generate`); the default reads back fewest times, 1 yields each token as soon as it is chosen
        (the next step already queued on the device) for a reader watching every token."""
        if not isinstance(follow_steps, int) or isinstance(follow_steps, bool) or not 1 <= follow_steps <= RING_STEPS:
            raise ArgumentError(f"follow_steps must be an integer in [1, {RING_STEPS}], got {follow_steps!r}")
        params = with_seed(SamplingParams(temperature, top_k, top_p, seed, min_p, presence_penalty,
                                          frequency_penalty, repetition_penalty, logit_bias, min_tokens,
                                          stop_token_ids))  # seed None: one fresh seed a call
        n_new = check_max_new_tokens(max_new_tokens)
        ids = fit_context(self._check_ids(ids), n_new, self.n_ctx, truncate_prompt)
        for i, _ in params.logit_bias:
            self._check_ids([i])
        eos = (self.eos_ids if stop_at_eos else frozenset()) | frozenset(self._check_ids(params.stop_token_ids)
                                                                          if params.stop_token_ids else ())
        state = SequenceState(ids, self.eos_ids)  # (min_tokens masks the EOS ids whether or not they stop)

        def pick(row: Any, position: int) -> int:
            tok = sample(row, params, position, state)
            state.add(tok)
            return tok

        runner = self._runners.acquire(1, lambda: self.runner(1, bucketed=False, weak=True))
        try:  # (greedy without moved logits: the device's argmax, steps followed on the device)
            yield from generate(runner, ids, n_new, params.greedy and not params.moves_logits, pick, eos,
                                batch=follow_steps, reuse_prefix=reuse_prefix)
        finally:
            self._runners.release(1, runner)

    def generate(self, ids: Sequence[int], max_new_tokens: int = 32, **kw: Any) -> list[int]:
        """New token ids (a list), greedy by default (temperature=0)."""
        return list(self.generate_ids(ids, max_new_tokens, **kw))

    def generate_batch(self, prompts: Sequence[Sequence[int]], max_new_tokens: int = 32,
                       stop_at_eos: bool = True) -> list[list[int]]:
        """Greedy continuations of several prompts decoded together: one forward over all rows a step (the weights
        read once for the batch, as one matrix product), a captured graph replayed. Each list stops after its first
        EOS. The rows are not promised bit-identical to decoding each alone (the server's batched engine is: it
        multiplies row by row). No prompts: no continuations (an empty list)."""
        n_new = check_max_new_tokens(max_new_tokens)
        if not prompts:
            return []
        rows = [fit_context(self._check_ids(p), n_new, self.n_ctx, False) for p in prompts]
        out: list[list[int]] = [[] for _ in rows]
        eos = self.eos_ids if stop_at_eos else frozenset()
        runner = self._runners.acquire(("batch", len(rows)), lambda: self.runner(max(1, len(rows)), invariant=False,
                                                                                bucketed=False, weak=True))
        try:
            for column in generate_batch(runner, rows, n_new):
                for r, tok in zip(out, column, strict=True):
                    if not (r and r[-1] in eos):
                        r.append(tok)  # type: ignore[arg-type]
        finally:
            self._runners.release(("batch", len(rows)), runner)
        return out

    def stream(self, prompt: str, max_new_tokens: int = 50, **kw: Any) -> Iterator[str]:
        """Generated text, piece by piece, as soon as it forms whole UTF-8 characters (special tokens not shown)."""
        tok = self._need_tokenizer()
        yield from tok.stream_decode(self.generate_ids(self.encode(prompt), max_new_tokens, **kw))

    # -- text ----------------------------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The ids of `text`, with the tokenizer's own special tokens (a BOS for Llama 3) as transformers'
        `tokenizer(text)` adds them; `add_special_tokens=False` for text that writes its own (a rendered chat)."""
        ids: list[int] = self._need_tokenizer().encode(check_text(text), add_special_tokens=add_special_tokens)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        text: str = self._need_tokenizer().decode(ids)
        return text

    def apply_chat_template(self, messages: Sequence[Any], add_generation_prompt: bool = True, tokenize: bool = False,
                            **kwargs: Any) -> Any:
        """The conversation as the model's chat template renders it (jinja2, as transformers renders it; a model
        without a template gets webtensor's plain one, `chat.PLAIN_TEMPLATE`); with `tokenize`, its token ids."""
        from ..chat import template_for

        text = template_for(self).render(messages, add_generation_prompt=add_generation_prompt, **kwargs)
        if not tokenize:
            return text
        return self._need_tokenizer().encode(text, add_special_tokens=False)

    def _need_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise SamplingError("this model has no tokenizer (random weights): pass token ids instead of text")
        return self.tokenizer

    def _check_ids(self, ids: Sequence[int]) -> list[int]:
        return check_ids(ids, self.vocab_size)

    def __repr__(self) -> str:
        s = self.spec
        return (f"{type(self).__name__}({self.name!r}, {s.architecture}, {s.n_layer} layers, {s.width} wide, "
                f"{self.device.describe()})")


def default_kv_dtype(device: Any) -> str:
    """The KV cache's type unless asked: float16 where the device's kernels read float16 (a WebGPU adapter with
    shader-f16), float32 elsewhere (the CPU reference, which widens every float16 anyway)."""
    return "float16" if device.has_f16 and not device.backend.widens_f16 else "float32"


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


def memory_line(weight_bytes: int, weights: str, kv_dtype: str, position_bytes: int, positions: int,
                blocks: int | None = None, block_size: int = BLOCK_SIZE, window: int | None = None,
                sequence_blocks: int | None = None) -> str:
    """"weights W (dtype), KV float16 K a position, pool P (N positions[ in B blocks of 16])[, every layer's window
    W: a sequence holds at most S blocks]": what a model on a device takes (`LanguageModel.describe`, the server's
    start line); `window`: the model's window where every layer slides (`ModelSpec.kv_window`: the blocks behind
    it are given back), `sequence_blocks` the most blocks a sequence then holds."""
    in_blocks = f" in {blocks:,} blocks of {block_size}" if blocks is not None else ""
    slides = ""
    if window is not None:
        slides = f", every layer's window {window:,} positions"
        if sequence_blocks is not None:
            slides += f": a sequence holds at most {sequence_blocks:,} blocks"
    return (f"weights {_bytes(weight_bytes)} ({weights}), KV {kv_dtype} {_bytes(position_bytes)} a position, "
            f"pool {_bytes(position_bytes * positions)} ({positions:,} positions{in_blocks}){slides}")
